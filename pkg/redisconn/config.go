package redisconn

import (
	"errors"
	"fmt"
	"net"
	"time"

	"bulwark/pkg/secret"
)

// Mode is how Bulwark reaches Redis.
type Mode string

// The three deployments.
const (
	// ModeStandalone is one Redis server at Config.Addr (the default).
	ModeStandalone Mode = "standalone"
	// ModeSentinel is a master and its replicas watched by Redis
	// Sentinel: the client asks the sentinels for the master and follows
	// a failover to the replica they promote.
	ModeSentinel Mode = "sentinel"
	// ModeCluster is a Redis Cluster: keys are spread over its masters by
	// hash slot (pkg/config/keys.go says which key lives where).
	ModeCluster Mode = "cluster"
)

// Defaults.
const (
	// PoolSizeDefault is the connections per server of one process: the
	// worker's 32 asynq goroutines each hold one at times, plus the
	// sweeps, the hub and the API's handlers.
	PoolSizeDefault = 64
	// ReplicaAckTimeoutDefault bounds the wait for replicas to confirm
	// an accepted request (Config.MinReplicasAcked).
	ReplicaAckTimeoutDefault = time.Second
)

// Config locates Redis. Zero values mean the defaults; Validate names the
// field at fault as config.yaml spells it ("redis.sentinel.addrs").
type Config struct {
	// Mode is standalone, sentinel or cluster. Default standalone.
	Mode Mode
	// Addr is host:port of the one server (standalone only).
	Addr string
	// DB is the logical database (standalone and sentinel). A cluster has
	// only database 0.
	DB int
	// Password of the Redis servers (all modes).
	Password secret.String
	// MasterName is the name the sentinels know the master by (sentinel).
	MasterName string
	// SentinelAddrs are host:port of the sentinels (sentinel): any one
	// that answers is enough, three or more keep a quorum.
	SentinelAddrs []string
	// SentinelPassword is the sentinels' own requirepass, if any.
	SentinelPassword secret.String
	// ClusterAddrs are host:port of some cluster nodes (cluster); the
	// client learns the others from them.
	ClusterAddrs []string
	// PoolSize is the connections per server. Default PoolSizeDefault.
	PoolSize int
	// MinReplicasAcked, when above 0, makes "accepted" mean "on that many
	// replicas": after storing a request the API waits (Redis WAIT) until
	// that many replicas have it, and answers 503 instead of 202 when they
	// do not within ReplicaAckTimeout. With it, a failover — even the
	// master killed — loses no accepted request. Default 0 (Redis
	// acknowledges from the master's memory alone). Set it only when the
	// master has replicas: with none, every submission fails.
	MinReplicasAcked int
	// ReplicaAckTimeout bounds that wait. Default ReplicaAckTimeoutDefault.
	ReplicaAckTimeout time.Duration
}

// WithDefaults returns c with its zero fields set to the defaults.
func (c Config) WithDefaults() Config {
	if c.Mode == "" {
		c.Mode = ModeStandalone
	}
	if c.PoolSize == 0 {
		c.PoolSize = PoolSizeDefault
	}
	if c.ReplicaAckTimeout == 0 {
		c.ReplicaAckTimeout = ReplicaAckTimeoutDefault
	}
	return c
}

// Validate checks c (after WithDefaults); each error names its field.
func (c Config) Validate() error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("redis.%s: "+format, append([]any{field}, args...)...))
	}
	addrs := func(field string, as []string) {
		for i, a := range as {
			if _, _, err := net.SplitHostPort(a); err != nil {
				add(fmt.Sprintf("%s[%d]", field, i), "must be host:port, got %q", a)
			}
		}
	}
	unused := func(field string, set bool) {
		if set {
			add(field, "is not used with mode %s: remove it", c.Mode)
		}
	}
	switch c.Mode {
	case ModeStandalone:
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			add("addr", "must be host:port, got %q", c.Addr)
		}
		unused("sentinel", c.MasterName != "" || len(c.SentinelAddrs) > 0)
		unused("cluster", len(c.ClusterAddrs) > 0)
	case ModeSentinel:
		if c.MasterName == "" {
			add("sentinel.master_name", "is required with mode sentinel")
		}
		if len(c.SentinelAddrs) == 0 {
			add("sentinel.addrs", "at least one sentinel address is required with mode sentinel")
		}
		addrs("sentinel.addrs", c.SentinelAddrs)
		unused("addr", c.Addr != "")
		unused("cluster", len(c.ClusterAddrs) > 0)
	case ModeCluster:
		if len(c.ClusterAddrs) == 0 {
			add("cluster.addrs", "at least one node address is required with mode cluster")
		}
		addrs("cluster.addrs", c.ClusterAddrs)
		if c.DB != 0 {
			add("db", "must be 0 with mode cluster (a cluster has only database 0), got %d", c.DB)
		}
		unused("addr", c.Addr != "")
		unused("sentinel", c.MasterName != "" || len(c.SentinelAddrs) > 0)
	default:
		add("mode", "must be standalone, sentinel or cluster, got %q", c.Mode)
	}
	if c.DB < 0 {
		add("db", "must not be negative, got %d", c.DB)
	}
	if c.MinReplicasAcked < 0 {
		add("min_replicas_acked", "must not be negative, got %d", c.MinReplicasAcked)
	}
	if c.PoolSize < 0 {
		add("pool_size", "must not be negative, got %d", c.PoolSize)
	}
	if c.ReplicaAckTimeout < time.Millisecond {
		add("replica_ack_timeout", "must be at least 1ms, got %s", c.ReplicaAckTimeout)
	}
	return errors.Join(errs...)
}

// Where names the Redis a process talks to, for logs and errors: no
// password, ever.
func (c Config) Where() string {
	switch c.Mode {
	case ModeSentinel:
		return fmt.Sprintf("sentinel master %q via %v", c.MasterName, c.SentinelAddrs)
	case ModeCluster:
		return fmt.Sprintf("cluster via %v", c.ClusterAddrs)
	}
	return c.Addr
}
