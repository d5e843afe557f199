package service

// keyspace gives each component its namespace under redis.prefix (default
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
//	<prefix>tenant:<name> (GCRA state)                tenantLimiter
//
// asynq keeps its own keys under "asynq:{<queue>}:…" (pkg/queue/keys.go).
type keyspace string

// keys is the process's keyspace.
func (b *Base) keys() keyspace { return keyspace(b.Cfg.Redis.Prefix) }

func (k keyspace) root() string          { return string(k) }
func (k keyspace) slots() string         { return string(k) + "slots:" }
func (k keyspace) keypool() string       { return string(k) + "keypool:" }
func (k keyspace) breaker() string       { return string(k) + "breaker:" }
func (k keyspace) historyOutbox() string { return string(k) + "history:outbox" }
func (k keyspace) tenant(name string) string {
	return string(k) + "tenant:" + name
}
