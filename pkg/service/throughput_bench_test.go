package service_test

import (
	"testing"
	"time"
)

// BenchmarkQueuedPath measures the whole queued path — HTTP submit, cache
// miss, admission, live record, asynq, one worker process, slot, key pool,
// breaker, provider call (mock, no latency), result, history, cache write —
// as completed requests per second, with 400 distinct requests submitted
// by 8 concurrent clients.
func BenchmarkQueuedPath(b *testing.B) {
	for range b.N {
		b.StopTimer()
		s := newSystem(b, opts{extraYML: "queue: {queue_max_depth: 5000}"})
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
