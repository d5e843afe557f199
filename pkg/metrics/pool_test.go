package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

// fakePool answers fixed pool statistics.
type fakePool redis.PoolStats

func (f fakePool) PoolStats() *redis.PoolStats { s := redis.PoolStats(f); return &s }

// The collector reports go-redis's figures as they stand: connections by
// state, waits, time waited and timeouts.
func TestRedisPoolCollector(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewRedisPoolCollector(fakePool{TotalConns: 7, IdleConns: 2, WaitCount: 4,
		WaitDurationNs: 1_500_000_000, Timeouts: 3}))
	want := `
# HELP bulwark_redis_pool_connections Connections in this process's Redis pool, by state (idle, in_use).
# TYPE bulwark_redis_pool_connections gauge
bulwark_redis_pool_connections{state="idle"} 2
bulwark_redis_pool_connections{state="in_use"} 5
# HELP bulwark_redis_pool_timeouts_total Commands that found no free Redis connection within the pool timeout and failed.
# TYPE bulwark_redis_pool_timeouts_total counter
bulwark_redis_pool_timeouts_total 3
# HELP bulwark_redis_pool_wait_seconds_total Time commands spent waiting for a free Redis connection.
# TYPE bulwark_redis_pool_wait_seconds_total counter
bulwark_redis_pool_wait_seconds_total 1.5
# HELP bulwark_redis_pool_waits_total Commands that waited for a free Redis connection.
# TYPE bulwark_redis_pool_waits_total counter
bulwark_redis_pool_waits_total 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
