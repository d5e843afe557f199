package redisconn_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/redisconn"
	"bulwark/pkg/testkit/testenv"
)

// Each mode gets its client and asynq option.
func TestModes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cfg    redisconn.Config
		client string
		opt    asynq.RedisConnOpt
	}{
		{redisconn.Config{Addr: "127.0.0.1:1"}, "*redis.Client", asynq.RedisClientOpt{Addr: "127.0.0.1:1"}},
		{redisconn.Config{Mode: redisconn.ModeSentinel, MasterName: "m", SentinelAddrs: []string{"127.0.0.1:2"}, DB: 3},
			"*redis.Client", asynq.RedisFailoverClientOpt{MasterName: "m", SentinelAddrs: []string{"127.0.0.1:2"}, DB: 3}},
		{redisconn.Config{Mode: redisconn.ModeCluster, ClusterAddrs: []string{"127.0.0.1:3"}},
			"*redis.ClusterClient", asynq.RedisClusterClientOpt{Addrs: []string{"127.0.0.1:3"}}},
	}
	for _, tt := range tests {
		c := redisconn.New(tt.cfg)
		got := ""
		switch c.(type) {
		case *redis.Client:
			got = "*redis.Client"
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
		}
		_ = c.Close()
		if got != tt.client {
			t.Errorf("%s: client %s, want %s", tt.cfg.WithDefaults().Mode, got, tt.client)
		}
		if opt := redisconn.AsynqOpt(tt.cfg); !sameOpt(opt, tt.opt) {
			t.Errorf("%s: asynq option %#v, want %#v", tt.cfg.WithDefaults().Mode, opt, tt.opt)
		}
	}
}

func sameOpt(a, b asynq.RedisConnOpt) bool {
	switch a := a.(type) {
	case asynq.RedisClientOpt:
		b, ok := b.(asynq.RedisClientOpt)
		return ok && a.Addr == b.Addr && a.DB == b.DB
	case asynq.RedisFailoverClientOpt:
		b, ok := b.(asynq.RedisFailoverClientOpt)
		return ok && a.MasterName == b.MasterName && a.DB == b.DB && len(a.SentinelAddrs) == 1 && a.SentinelAddrs[0] == b.SentinelAddrs[0]
	case asynq.RedisClusterClientOpt:
		b, ok := b.(asynq.RedisClusterClientOpt)
		return ok && len(a.Addrs) == 1 && a.Addrs[0] == b.Addrs[0]
	}
	return false
}

// WaitReplicas confirms a key its replica holds, refuses more replicas
// than there are, and a key the master does not hold; on a cluster it
// asks the key's own master.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	t.Run("sentinel", func(t *testing.T) {
		t.Parallel()
		s := testenv.RedisSentinel(t)
		rdb := redisconn.New(redisconn.Config{Mode: redisconn.ModeSentinel, MasterName: s.MasterName, SentinelAddrs: s.Sentinels})
		defer rdb.Close()
		waitReplicas(t, rdb, 1)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := testenv.RedisCluster(t)
		rdb := redisconn.New(redisconn.Config{Mode: redisconn.ModeCluster, ClusterAddrs: c.Addrs})
		defer rdb.Close()
		waitReplicas(t, rdb, 0) // masters without replicas
	})
}

func waitReplicas(t *testing.T, rdb redis.UniversalClient, replicas int) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	const key, marker = "t:{job}:job:1", "t:{job}:replicated"
	if err := rdb.Set(ctx, key, "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if replicas > 0 {
		if err := redisconn.WaitReplicas(ctx, rdb, key, marker, replicas, 5*time.Second); err != nil {
			t.Fatalf("WaitReplicas(%d): %v", replicas, err)
		}
	}
	if err := redisconn.WaitReplicas(ctx, rdb, key, marker, replicas+1, 100*time.Millisecond); !errors.Is(err, redisconn.ErrNotReplicated) {
		t.Fatalf("WaitReplicas(%d) with %d replicas: %v, want ErrNotReplicated", replicas+1, replicas, err)
	}
	if err := redisconn.WaitReplicas(ctx, rdb, "t:{job}:job:missing", marker, 1, 100*time.Millisecond); !errors.Is(err, redisconn.ErrKeyGone) {
		t.Fatalf("WaitReplicas of a missing key: %v, want ErrKeyGone", err)
	}
	if err := redisconn.WaitReplicas(ctx, rdb, key, marker, 0, 0); err != nil {
		t.Fatalf("WaitReplicas(0): %v", err)
	}
}
