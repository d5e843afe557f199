package config

// Keyspace gives each component its namespace under redis.prefix (default
// "bulwark:"), here and nowhere else, so no two can collide. Each package
// builds its own keys inside its namespace in one place (its keys.go or
// key functions). Every key Bulwark writes:
//
//	<prefix>{job}:job:<id>, ev:<id>, live, live-of:<tenant>,
//	  idem:<tenant>:<key>, bytes-of:<tenant>,
//	  expiry-of:<tenant>, replicated, events (channel)    pkg/job
//	<prefix>{slots}:…                                     pkg/slots
//	<prefix>{keypool}:…                                   pkg/keypool
//	<prefix>{breaker}:…                                   pkg/breaker
//	<prefix>queue:starts, queue:dequeued (channel)        pkg/queue
//	<prefix>inflight:<ref>                                pkg/coalesce
//	<prefix>alert:throttle:<kind>:<subject>               pkg/alert
//	<prefix>history:outbox                                pkg/history
//	{<prefix>history:outbox}:replaying, :bytes (its slot)  pkg/history
//	<prefix>sweep:lock, alerts:down, history:reconciled,  pkg/maintenance
//	<prefix>history:reconcile:watch                       pkg/maintenance
//	<prefix>tenant:<name> (GCRA state)                    Tenant below
//	<prefix>cache:invalidated (channel)                   CacheInvalidated below
//
// asynq keeps its own keys under "asynq:{<queue>}:…" (pkg/queue/keys.go)
// and a few global ones ("asynq:queues", "asynq:servers", …).
//
// # Hash slots (Redis Cluster)
//
// In a cluster every Lua script, MULTI and multi-key command must have all
// its keys in one hash slot, and Redis hashes only the part of a key
// between the first "{" and the next "}" when there is one (the hash tag).
// So every concept whose scripts span several keys carries one tag, and
// all its keys live in one slot, on one master:
//
//	{job}      every request's record, event stream, idempotency key, a
//	           compat call's join key and the live sets: createScript checks
//	           a tenant's live set and an idempotency or join key while it
//	           stores the record, and the transition script ends a record,
//	           leaves the live set and times its join key out in one step.
//	{slots}    the global concurrency limit: one set of leases and waiters
//	           that every acquire reads whole.
//	{keypool}  every provider key's state and leases: acquire picks the
//	           best of a route's keys in one script, the snapshot reads all.
//	{breaker}  every breaker's state and probes, and the names set.
//	{<queue>}  asynq's per-queue keys ("asynq:{critical}:pending"), by
//	           asynq itself; Bulwark reads them with single-key commands and
//	           non-transactional pipelines, which go-redis splits by node.
//
// The single-key concepts carry no tag and spread over the cluster by
// their own names: coalescing claims (inflight:<ref>), tenant rate state,
// the queue's start log, alert throttles, the history outbox, the sweep
// lock. Pub/Sub channels (events, queue:dequeued, cache:invalidated) are not keys: PUBLISH
// reaches subscribers on every node.
//
// The trade-off: a tagged concept lives on one master, whose CPU bounds
// it. {slots}, {keypool} and {breaker} are small and global by nature (one
// limit, one pool, one set of breakers). {job} carries the most traffic —
// three to six script calls per request — and is the one to shard next:
// by tenant ("{job:<tenant>}" for records, streams, idempotency keys and
// the tenant's live set) with the global live set split per shard for the
// orphan sweep, or by request id with the tenant limit kept apart. The key
// pool could shard by route ("{keypool:openai/gpt4o}"): acquire reads one
// route's keys only; the snapshot would read each route's slot in turn.
//
// A prefix with a hash tag of its own ("{bulwark}:") puts every Bulwark key
// in that one slot: valid, but then a single master holds them all.
type Keyspace string

// Keyspace is the process's keyspace.
func (r Redis) Keyspace() Keyspace { return Keyspace(r.Prefix) }

// Root is the prefix of the components that namespace their keys
// themselves with single-key scripts and commands only (queue, coalesce,
// alert, maintenance).
func (k Keyspace) Root() string { return string(k) }

// Jobs is pkg/job's namespace: one hash slot ({job}).
func (k Keyspace) Jobs() string { return string(k) + "{job}:" }

// Slots is pkg/slots' namespace: one hash slot ({slots}).
func (k Keyspace) Slots() string { return string(k) + "{slots}:" }

// Keypool is pkg/keypool's namespace: one hash slot ({keypool}).
func (k Keyspace) Keypool() string { return string(k) + "{keypool}:" }

// Breaker is pkg/breaker's namespace: one hash slot ({breaker}).
func (k Keyspace) Breaker() string { return string(k) + "{breaker}:" }

// HistoryOutbox is the list of history writes waiting for PostgreSQL.
func (k Keyspace) HistoryOutbox() string { return string(k) + "history:outbox" }

// Tenant is the key of a tenant's submission-rate (GCRA) state.
func (k Keyspace) Tenant(name string) string { return string(k) + "tenant:" + name }

// CacheInvalidated is the Pub/Sub channel on which a process that deleted
// cached answers tells every API process to empty its memo of exact hits.
func (k Keyspace) CacheInvalidated() string { return string(k) + "cache:invalidated" }
