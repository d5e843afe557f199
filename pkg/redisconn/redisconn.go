// Package redisconn opens Bulwark's connections to Redis, in each of the
// three deployments config.yaml can name (redis.mode): one server
// (standalone), a master with replicas under Redis Sentinel (sentinel), or
// a Redis Cluster (cluster). It is the one place that builds a go-redis
// client (New) and asynq's connection options (AsynqOpt), so the api,
// worker and scheduler processes, asynqmon and the asynq scheduler all
// reach the same Redis the same way.
//
// # What each mode means for Bulwark
//
// Standalone and sentinel look the same to the code: one master holds
// every key. Under Sentinel the client asks the sentinels for the master
// and, on a failover, switches to the promoted replica; commands in
// flight at the switch fail and are retried by their callers (asynq
// re-runs a task whose end it could not write once its lease expires).
//
// In a cluster every multi-key command, MULTI and Lua script must keep its
// keys in one hash slot. Bulwark's keys carry a hash tag per concept
// ("bulwark:{slots}:…", pkg/config/keys.go); asynq tags its own by queue
// ("asynq:{critical}:…"). PUBLISH reaches subscribers on every node.
//
// # Replication and "accepted"
//
// Redis replicates asynchronously: a write the master acknowledged can be
// lost if the master dies before a replica has it, and a Sentinel
// failover promotes the replica as it is. Config.MinReplicasAcked closes
// that gap for what matters — the accepted request — with WaitReplicas:
// the API answers 202 only once replicas confirm the stored record.
// Everything else a failover can lose (a task's move to active, a status
// change) is redone: the orphan sweep re-enqueues a record whose task is
// gone, asynq re-runs a task whose end was lost, and ending a request
// twice is refused by its record.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// New returns a client for c (after WithDefaults): a *redis.Client for
// standalone, a failover *redis.Client for sentinel, a *redis.ClusterClient
// for cluster. The caller closes it.
func New(c Config) redis.UniversalClient {
	c = c.WithDefaults()
	switch c.Mode {
	case ModeSentinel:
		return redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: c.MasterName, SentinelAddrs: c.SentinelAddrs,
			SentinelPassword: c.SentinelPassword.Reveal(),
			Password:         c.Password.Reveal(), DB: c.DB, PoolSize: c.PoolSize,
		})
	case ModeCluster:
		return redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: c.ClusterAddrs, Password: c.Password.Reveal(), PoolSize: c.PoolSize,
		})
	}
	return redis.NewClient(&redis.Options{Addr: c.Addr, DB: c.DB, Password: c.Password.Reveal(), PoolSize: c.PoolSize})
}

// AsynqOpt returns asynq's connection options for c, for what builds its
// own connection (asynqmon, the scheduler, which closes its connection on
// Shutdown).
func AsynqOpt(c Config) asynq.RedisConnOpt {
	c = c.WithDefaults()
	switch c.Mode {
	case ModeSentinel:
		return asynq.RedisFailoverClientOpt{MasterName: c.MasterName, SentinelAddrs: c.SentinelAddrs,
			SentinelPassword: c.SentinelPassword.Reveal(), Password: c.Password.Reveal(), DB: c.DB}
	case ModeCluster:
		return asynq.RedisClusterClientOpt{Addrs: c.ClusterAddrs, Password: c.Password.Reveal()}
	}
	return asynq.RedisClientOpt{Addr: c.Addr, DB: c.DB, Password: c.Password.Reveal()}
}

// masters calls fn with each master rdb writes to: the one server, or
// every master of a cluster.
func masters(ctx context.Context, rdb redis.UniversalClient, fn func(ctx context.Context, c *redis.Client) error) error {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, fn)
	}
	c, ok := rdb.(*redis.Client)
	if !ok {
		return fmt.Errorf("redisconn: unsupported client %T", rdb)
	}
	return fn(ctx, c)
}

// Check warns about a Redis that can lose accepted requests: one that
// evicts keys under memory pressure (queues, records, key state vanish),
// has no memory bound (it grows until the machine's memory is gone) or
// persists nothing (a restart empties it). Every master of a cluster
// is checked. A server that refuses CONFIG (some managed services) is not.
func Check(ctx context.Context, rdb redis.UniversalClient, logger *slog.Logger) {
	// fn runs on every master at once (ForEachMaster); the logger is safe
	// for concurrent use.
	_ = masters(ctx, rdb, func(ctx context.Context, c *redis.Client) error {
		get := func(name string) (string, bool) {
			v, err := c.ConfigGet(ctx, name).Result()
			if err != nil {
				return "", false
			}
			s, ok := v[name]
			return s, ok
		}
		addr := c.Options().Addr
		if p, ok := get("maxmemory-policy"); ok && p != "noeviction" {
			logger.Warn("redis: maxmemory-policy evicts keys; accepted requests and key state can vanish under memory pressure: set maxmemory-policy noeviction",
				"maxmemory-policy", p, "server", addr)
		}
		if m, ok := get("maxmemory"); ok && m == "0" {
			logger.Warn("redis: no maxmemory; Redis grows until the machine runs out of memory: set maxmemory above the tenants' max_stored_bytes with maxmemory-policy noeviction",
				"server", addr)
		}
		aof, ok1 := get("appendonly")
		save, ok2 := get("save")
		if ok1 && ok2 && aof != "yes" && save == "" {
			logger.Warn("redis: no persistence (appendonly no, save \"\"); a restart loses every queued request: set appendonly yes",
				"server", addr)
		}
		return nil
	})
}

// Errors of WaitReplicas.
var (
	// ErrNotReplicated: too few replicas confirmed in time.
	ErrNotReplicated = errors.New("redisconn: not confirmed by enough replicas")
	// ErrKeyGone: the master the client now talks to does not hold the
	// key (it expired, or a failover lost it).
	ErrKeyGone = errors.New("redisconn: key not on the master")
)

// WaitReplicas returns once n replicas of the master holding key have
// every write made to that master up to now, key included; ErrNotReplicated
// after timeout; ErrKeyGone when that master does not hold key.
//
// WAIT counts replicas that confirmed the calling connection's last
// write, so on one connection it writes marker (a counter in key's hash
// slot: same master in a cluster), then WAITs: two round trips. Replication is one ordered
// stream, so a replica that has the marker has every earlier write. The
// connection first checks that key exists on that server: after a
// failover the client may already talk to a new master that never got
// key, whose replicas would confirm the marker but not key.
func WaitReplicas(ctx context.Context, rdb redis.UniversalClient, key, marker string, n int, timeout time.Duration) error {
	if n <= 0 {
		return nil
	}
	c, ok := rdb.(*redis.Client)
	if cc, isCluster := rdb.(*redis.ClusterClient); isCluster {
		var err error
		if c, err = cc.MasterForKey(ctx, key); err != nil {
			return fmt.Errorf("redisconn: master of %s: %w", key, err)
		}
		ok = true
	}
	if !ok {
		return fmt.Errorf("redisconn: unsupported client %T", rdb)
	}
	conn := c.Conn()
	defer func() { _ = conn.Close() }()
	var exists *redis.IntCmd
	if _, err := conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		exists = p.Exists(ctx, key)
		p.Incr(ctx, marker)
		return nil
	}); err != nil {
		return fmt.Errorf("redisconn: wait for %d replicas: %w", n, err)
	}
	if exists.Val() != 1 {
		return fmt.Errorf("%w: %s (expired, or lost in a failover)", ErrKeyGone, key)
	}
	// WAIT on the same connection (go-redis pipelines lack it): its read
	// deadline follows timeout.
	got, err := conn.Wait(ctx, n, timeout).Result()
	if err != nil {
		return fmt.Errorf("redisconn: wait for %d replicas: %w", n, err)
	}
	if got < int64(n) {
		return fmt.Errorf("%w: %d of %d replicas within %s", ErrNotReplicated, got, n, timeout)
	}
	return nil
}
