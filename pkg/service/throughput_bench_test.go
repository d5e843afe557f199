package service_test

import (
	"testing"
	"time"
)

// BenchmarkQueuedPath measures the whole queued path — HTTP submit, cache
// miss, admission, live record, asynq, one worker process, slot, key pool,
// breaker, provider call (mock, no latency), result, history, cache write —
// as completed requests per second, with 400 distinct requests submitted
// by 8 concurrent clients. The keys' limits are far above the load: the
// figure is the path's own cost, not the pool's pacing (with the default
// test keys, 2 × 600 RPM, it would read 20 requests/s whatever the path).
func BenchmarkQueuedPath(b *testing.B) {
	for range b.N {
		b.StopTimer()
		s := newSystem(b, opts{extraYML: "queue: {queue_max_depth: 5000}", keysYML: unlimitedKeys})
		s.cfg.Worker.Concurrency = 32
		api := s.startAPI()
		s.startWorker()
		b.StartTimer()
		start := time.Now()
		ids := api.submitMany(b, 400, "throughput", nil)
		for _, id := range ids {
			api.waitStatus(b, id, 60*time.Second, "completed")
		}
		b.ReportMetric(float64(len(ids))/time.Since(start).Seconds(), "req/s")
	}
}

// unlimitedKeys are four claude/sonnet keys no benchmark load reaches.
const unlimitedKeys = `
keys:
  - {id: claude-sonnet-1, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-1", rpm_limit: 1000000, tpm_limit: 1000000000}
  - {id: claude-sonnet-2, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-2", rpm_limit: 1000000, tpm_limit: 1000000000}
  - {id: claude-sonnet-3, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-3", rpm_limit: 1000000, tpm_limit: 1000000000}
  - {id: claude-sonnet-4, provider: claude, model_tier: sonnet, api_key: "mock-claude-key-4", rpm_limit: 1000000, tpm_limit: 1000000000}`
