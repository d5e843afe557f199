package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// TestAsynqKeyLayout checks the keys Bulwark reads asynq's queues under
// (keys.go) against where asynq itself puts tasks: pending, scheduled and
// retrying. It fails when an asynq upgrade moves them.
func TestAsynqKeyLayout(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t)
	q := New(rdb, Config{Prefix: "t:"})
	defer q.Close()
	p := priority.High

	if err := q.Enqueue(ctx, "now", p, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Enqueue(ctx, "later", p, time.Hour); err != nil {
		t.Fatal(err)
	}
	if ids, err := rdb.LRange(ctx, pendingKey(p), 0, -1).Result(); err != nil || len(ids) != 1 || ids[0] != "now" {
		t.Fatalf("pending list %s = %v, %v; want [now]", pendingKey(p), ids, err)
	}
	if n, err := rdb.ZCard(ctx, scheduledKey(p)).Result(); err != nil || n != 1 {
		t.Fatalf("scheduled set %s holds %d, %v; want 1", scheduledKey(p), n, err)
	}

	// A task whose handler fails goes to the retry set; Shutdown returns
	// once the worker has moved it there.
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{Name(p): 1},
		RetryDelayFunc: func(int, error, *asynq.Task) time.Duration { return time.Hour }})
	ran := make(chan struct{})
	mux := asynq.NewServeMux()
	mux.HandleFunc(TaskType, func(context.Context, *asynq.Task) error {
		close(ran)
		return errors.New("fail once")
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	<-ran
	srv.Shutdown()
	if n, err := rdb.ZCard(ctx, retryKey(p)).Result(); err != nil || n != 1 {
		t.Fatalf("retry set %s holds %d, %v; want 1", retryKey(p), n, err)
	}
	if n, err := rdb.LLen(ctx, pendingKey(p)).Result(); err != nil || n != 0 {
		t.Fatalf("pending list %s holds %d after the run, %v; want 0", pendingKey(p), n, err)
	}

	info, err := asynq.NewInspectorFromRedisClient(rdb).GetQueueInfo(Name(p))
	if err != nil {
		t.Fatal(err)
	}
	pending, delayed, err := q.depths(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pending[p] != int64(info.Pending) || delayed[p] != int64(info.Scheduled+info.Retry) {
		t.Fatalf("depths pending %d delayed %d; asynq's inspector says pending %d scheduled %d retry %d",
			pending[p], delayed[p], info.Pending, info.Scheduled, info.Retry)
	}
}
