package testenv_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/testenv"
)

// TestRedisCluster: the cluster serves keys of every slot, and its error
// counters — what the cluster tests read to prove no script crossed
// slots — see a CROSSSLOT reply.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	c := testenv.RedisCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rdb := c.Client(t)
	for _, k := range []string{"a", "b", "c", "{x}1", "{x}2"} {
		if err := rdb.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	if err := rdb.MSet(ctx, "{x}1", "1", "{x}2", "2").Err(); err != nil {
		t.Fatalf("MSET in one slot: %v", err)
	}
	node := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	defer node.Close()
	// "a" and "b" hash to different slots: every node refuses the pair
	// (CROSSSLOT before any MOVED).
	if err := node.MSet(ctx, "a", "1", "b", "2").Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Fatalf("MSET across slots: %v, want CROSSSLOT", err)
	}
	stats, err := c.ErrorStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if stats["CROSSSLOT"] != 1 {
		t.Fatalf("errorstats %v, want CROSSSLOT 1", stats)
	}
}

// TestRedisSentinel: a failover client follows SENTINEL FAILOVER and a
// killed master, and keeps what was replicated before each.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	s := testenv.RedisSentinel(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	rdb := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.MasterName, SentinelAddrs: s.Sentinels})
	defer rdb.Close()
	if err := rdb.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d %v", n, err)
	}
	first, err := s.Master(ctx)
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	second, err := s.Failover(ctx)
	t.Logf("failover settled in %s", time.Since(began))
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatalf("failover kept the master at %s", first)
	}
	if err := rdb.Set(ctx, "after-failover", "1", 0).Err(); err != nil {
		t.Fatalf("write after the failover: %v", err)
	}
	if n, err := rdb.Wait(ctx, 1, 5*time.Second).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 after the failover: %d %v", n, err)
	}
	began = time.Now()
	killed, third, err := s.Kill(ctx)
	t.Logf("kill: promoted in %s", time.Since(began))
	if err != nil {
		t.Fatal(err)
	}
	if killed != second || third != first {
		t.Fatalf("kill: killed %s (master %s), promoted %s (want %s)", killed, second, third, first)
	}
	for _, k := range []string{"before", "after-failover"} {
		if err := rdb.Get(ctx, k).Err(); err != nil {
			t.Fatalf("GET %s after the kill: %v", k, err)
		}
	}
	began = time.Now()
	if err := s.Restart(ctx, killed); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart settled in %s", time.Since(began))
}
