package config

// Keyspace gives each component its namespace under redis.prefix (default
// "bulwark:"), here and nowhere else, so no two can collide. Each package
// builds its own keys inside its namespace in one place (its keys.go or
// key functions). Every key Bulwark writes:
//
//	<prefix>job:<id>, ev:<id>, live, live-of:<tenant>,
//	  idem:<tenant>:<key>, events (channel)           pkg/job
//	<prefix>queue:starts, queue:dequeued (channel)    pkg/queue
//	<prefix>slots:…                                   pkg/slots
//	<prefix>keypool:…                                 pkg/keypool
//	<prefix>breaker:…                                 pkg/breaker
//	<prefix>inflight:<ref>                            pkg/coalesce
//	<prefix>alert:throttle:<kind>:<subject>           pkg/alert
//	<prefix>history:outbox                            pkg/history
//	<prefix>sweep:lock, alerts:down                   pkg/maintenance
//	<prefix>tenant:<name> (GCRA state)                Tenant below
//
// asynq keeps its own keys under "asynq:{<queue>}:…" (pkg/queue/keys.go).
type Keyspace string

// Keyspace is the process's keyspace.
func (r Redis) Keyspace() Keyspace { return Keyspace(r.Prefix) }

// Root is the prefix of the components that namespace their keys
// themselves (job, queue, coalesce, alert, maintenance).
func (k Keyspace) Root() string { return string(k) }

// Slots is pkg/slots' namespace.
func (k Keyspace) Slots() string { return string(k) + "slots:" }

// Keypool is pkg/keypool's namespace.
func (k Keyspace) Keypool() string { return string(k) + "keypool:" }

// Breaker is pkg/breaker's namespace.
func (k Keyspace) Breaker() string { return string(k) + "breaker:" }

// HistoryOutbox is the list of history writes waiting for PostgreSQL.
func (k Keyspace) HistoryOutbox() string { return string(k) + "history:outbox" }

// Tenant is the key of a tenant's submission-rate (GCRA) state.
func (k Keyspace) Tenant(name string) string { return string(k) + "tenant:" + name }
