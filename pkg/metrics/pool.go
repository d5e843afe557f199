package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Names of the Redis connection pool's series.
const (
	NameRedisPoolConnections = "bulwark_redis_pool_connections"
	NameRedisPoolWaits       = "bulwark_redis_pool_waits_total"
	NameRedisPoolWaitSeconds = "bulwark_redis_pool_wait_seconds_total"
	NameRedisPoolTimeouts    = "bulwark_redis_pool_timeouts_total"
)

// RedisPool is what the pool collector reads: every go-redis client
// (single, failover, cluster) has it.
type RedisPool interface {
	PoolStats() *redis.PoolStats
}

// redisPoolCollector reports one process's Redis connection pool at each
// scrape. Its figures are go-redis's own cumulative counts, read as they
// stand (hence const metrics, not counters of our own).
type redisPoolCollector struct {
	pool                           RedisPool
	conns, waits, waited, timeouts *prometheus.Desc
}

// NewRedisPoolCollector reports pool's connections (idle and in use),
// how often and how long a command waited for a free connection, and how
// often it gave up (pool_timeout): a pool too small for the process's
// concurrency shows there first, long before Redis itself is busy. With
// a cluster client the figures are summed over its nodes' pools.
func NewRedisPoolCollector(pool RedisPool) prometheus.Collector {
	return &redisPoolCollector{
		pool: pool,
		conns: prometheus.NewDesc(NameRedisPoolConnections,
			"Connections in this process's Redis pool, by state (idle, in_use).", []string{"state"}, nil),
		waits: prometheus.NewDesc(NameRedisPoolWaits,
			"Commands that waited for a free Redis connection.", nil, nil),
		waited: prometheus.NewDesc(NameRedisPoolWaitSeconds,
			"Time commands spent waiting for a free Redis connection.", nil, nil),
		timeouts: prometheus.NewDesc(NameRedisPoolTimeouts,
			"Commands that found no free Redis connection within the pool timeout and failed.", nil, nil),
	}
}

func (c *redisPoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.conns
	ch <- c.waits
	ch <- c.waited
	ch <- c.timeouts
}

func (c *redisPoolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.PoolStats()
	if s == nil {
		return
	}
	idle := float64(s.IdleConns)
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, idle, "idle")
	ch <- prometheus.MustNewConstMetric(c.conns, prometheus.GaugeValue, max(0, float64(s.TotalConns)-idle), "in_use")
	ch <- prometheus.MustNewConstMetric(c.waits, prometheus.CounterValue, float64(s.WaitCount))
	ch <- prometheus.MustNewConstMetric(c.waited, prometheus.CounterValue, float64(s.WaitDurationNs)/1e9)
	ch <- prometheus.MustNewConstMetric(c.timeouts, prometheus.CounterValue, float64(s.Timeouts))
}
