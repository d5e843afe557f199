package service_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/mockprovider"
	"bulwark/pkg/testenv"
)

// TestRedisSentinelAcceptedOnReplica runs Bulwark through Redis Sentinel
// with redis.min_replicas_acked 1: every request answered 202 is already
// on the replica when the answer arrives (the master could die right
// then and the promoted replica would still run it), and completes.
func TestRedisSentinelAcceptedOnReplica(t *testing.T) {
	t.Parallel()
	rs := testenv.RedisSentinel(t)
	addrs := make([]string, len(rs.Sentinels))
	for i, a := range rs.Sentinels {
		addrs[i] = fmt.Sprintf("%q", a)
	}
	s := newSystem(t, opts{
		mock: mockprovider.Config{Latency: 20 * time.Millisecond},
		redisYML: fmt.Sprintf("redis: {mode: sentinel, sentinel: {master_name: %s, addrs: [%s]}, min_replicas_acked: 1}",
			rs.MasterName, strings.Join(addrs, ", ")),
	})
	api := s.startAPI()
	s.startWorker()
	replicaAddr, err := rs.Replica(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	replica := redis.NewClient(&redis.Options{Addr: replicaAddr})
	defer replica.Close()
	for i := range 10 {
		id := api.submit(t, ask(fmt.Sprintf("sentinel request %d", i)))
		if n, err := replica.Exists(t.Context(), api.base.Jobs.RecordKey(id)).Result(); err != nil || n != 1 {
			t.Fatalf("request %s answered 202 but not on the replica: %d %v", id, n, err)
		}
		api.waitStatus(t, id, 20*time.Second, "completed")
	}
}
