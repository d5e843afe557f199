package service_test

import (
	"context"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
)

// openStreams opens n SSE streams on api, spread over the given requests,
// and waits until each has received its first event.
func openStreams(t testing.TB, api *apiProc, ids []string, n int) []context.CancelFunc {
	t.Helper()
	var cancels []context.CancelFunc
	ready := make(chan struct{}, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", api.ts.URL+"/v1/requests/"+ids[i%len(ids)]+"/events", nil)
		req.Header.Set("Authorization", "Bearer "+devToken)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			if _, err := resp.Body.Read(buf); err == nil {
				ready <- struct{}{}
			}
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					return
				}
			}
		}()
	}
	deadline := time.After(60 * time.Second)
	for range n {
		select {
		case <-ready:
		case <-deadline:
			t.Fatal("streams did not open in time")
		}
	}
	return cancels
}

// redisClients counts the connections to the test's Redis database.
func redisClients(t testing.TB, opt *redis.Options) int {
	c := redis.NewClient(&redis.Options{Addr: opt.Addr, DB: opt.DB})
	defer c.Close()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, fmt.Sprintf(" db=%d ", opt.DB)) {
			n++
		}
	}
	return n - 1 // not this one
}

// 1,000 concurrent streams on one API process share its pooled Redis
// connections and one pub/sub subscription; none holds a connection of
// its own.
func TestThousandStreamsBoundedRedisConnections(t *testing.T) {
	t.Parallel()
	s := newSystem(t, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	ids := api.submitMany(t, 50, "streams", nil)
	before := redisClients(t, s.redis)
	cancels := openStreams(t, api, ids, 1000)
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	during := redisClients(t, s.redis)
	t.Logf("Redis connections of the test's database: %d before, %d with 1,000 streams open", before, during)
	// The API's pool is capped at 64 connections, plus its subscription.
	if during > before+70 || during >= 1000 {
		t.Fatalf("%d Redis connections for 1,000 streams (from %d)", during, before)
	}
	if got := api.base.Redis.PoolStats().TotalConns; got > 65 {
		t.Fatalf("the API process holds %d pooled connections", got)
	}
}

// BenchmarkThousandStreams reports what 1,000 concurrent SSE streams cost
// one API process: Redis connections and heap. Client and server share the
// test process, so the heap figure is an upper bound for the server.
func BenchmarkThousandStreams(b *testing.B) {
	s := newSystem(b, opts{extraYML: "cache: {enabled: false}"})
	api := s.startAPI()
	insp := s.inspector()
	_ = insp.PauseQueue(queue.Name(priority.Normal))
	ids := api.submitMany(b, 50, "bench-streams", nil)
	before := redisClients(b, s.redis)
	b.ResetTimer()
	for range b.N {
		runtime.GC()
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		cancels := openStreams(b, api, ids, 1000)
		runtime.GC()
		runtime.ReadMemStats(&m1)
		b.ReportMetric(float64(redisClients(b, s.redis)-before), "redis-conns")
		b.ReportMetric(float64(m1.HeapInuse-m0.HeapInuse)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(api.base.Redis.PoolStats().TotalConns), "api-pool-conns")
		for _, c := range cancels {
			c()
		}
	}
}
