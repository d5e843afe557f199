// Package redisha watches and steers a Redis Sentinel setup from outside,
// with the go-redis queries a test or a fault run needs around a failover:
// wait until a master, its replica and the sentinels agree (Settled); ask
// which server is master (Master) or replica (Replica); have a sentinel
// fail the master over (Failover); wait until every sentinel names a new
// master (Promoted). SentinelConfig returns a sentinel's configuration
// file's text. Poll and InfoField serve the Cluster helpers of pkg/testkit/testenv
// too.
//
// # Who uses it
//
// Two harnesses run Sentinel setups of their own: pkg/testkit/testenv, for the
// tests (RedisSentinel), and pkg/testkit/storm, for the fault bench that fails the
// master over under a storm (TestFaultRedisFailover). Each starts, kills
// and restarts its redis-server processes its own way — testenv in the
// test's temporary folder, storm beside the scenario's other processes —
// so only what does not depend on the processes lives here. pkg/testkit/storm
// cannot import pkg/testkit/testenv, which imports package testing; this package
// does not.
//
// # The setup it expects
//
// One master with one replica, watched by the sentinels in Sentinels.Addrs
// under Sentinels.MasterName, all reached on addresses the sentinels
// report as they are (loopback, no NAT). The sentinels declare a master
// down after one second without an answer, so a killed master is failed
// over within seconds.
//
// # Polling
//
// Redis announces none of these states to a client that did not subscribe
// before they happened (a replica synced, a sentinel that learned of
// another), so the waits poll every PollInterval until the caller's
// context ends; their errors name the state and the last error seen.
package redisha
