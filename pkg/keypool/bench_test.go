package keypool

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/llm"
	"bulwark/pkg/testkit/testenv"
)

// BenchmarkAcquireSuccess measures one Acquire plus its Success (two script
// round trips) with 1 and 8 concurrent clients, each its own Redis
// connection and Pool like separate worker processes, over 6 and 60 keys
// all serving the one route asked for (the worst case: the acquire script
// inspects every key of the route). Limits are high enough never to
// exhaust, even on the default 1 s window (16 million requests and tokens
// per window). Reported: ops/s (Acquire+Success pairs) and p50/p99 latency of
// the pair in µs.
func BenchmarkAcquireSuccess(b *testing.B) {
	for _, nkeys := range []int{6, 60} {
		for _, clients := range []int{1, 8} {
			b.Run(fmt.Sprintf("keys=%d/clients=%d", nkeys, clients), func(b *testing.B) {
				benchAcquireSuccess(b, nkeys, clients)
			})
		}
	}
}

func benchAcquireSuccess(b *testing.B, nkeys, clients int) {
	opts := testenv.RedisOptions(b)
	cfg := Config{Prefix: "bench:keypool:"}
	for i := range nkeys {
		cfg.Keys = append(cfg.Keys, key(fmt.Sprintf("k%02d", i), haiku, 1_000_000_000, 1_000_000_000))
	}
	ctx := context.Background()
	pools := make([]*Pool, clients)
	for i := range pools {
		c := redis.NewClient(opts)
		b.Cleanup(func() { c.Close() })
		p, err := New(ctx, c, cfg, nil)
		if err != nil {
			b.Fatal(err)
		}
		// Warm the connection and the script cache.
		l, err := p.Acquire(ctx, haiku, 100)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Success(ctx, l, llm.Usage{InputTokens: 80}, llm.RateLimit{}); err != nil {
			b.Fatal(err)
		}
		pools[i] = p
	}

	var (
		next      atomic.Int64
		wg        sync.WaitGroup
		mu        sync.Mutex
		latencies = make([]time.Duration, 0, b.N)
	)
	b.ResetTimer()
	start := time.Now()
	for _, p := range pools {
		wg.Go(func() {
			mine := make([]time.Duration, 0, b.N/clients+1)
			for next.Add(1) <= int64(b.N) {
				t0 := time.Now()
				l, err := p.Acquire(ctx, haiku, 100)
				if err != nil {
					b.Error(err)
					return
				}
				if err := p.Success(ctx, l, llm.Usage{InputTokens: 80}, llm.RateLimit{}); err != nil {
					b.Error(err)
					return
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()

	slices.Sort(latencies)
	pct := func(q float64) float64 {
		if len(latencies) == 0 {
			return 0
		}
		return float64(latencies[min(len(latencies)-1, int(q*float64(len(latencies))))].Microseconds())
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}
