package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/testenv"
)

func TestETAFor(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		n    int
		rate float64
		want time.Duration
	}{{0, 1, 0}, {1, 1, time.Second}, {10, 4, 3 * time.Second}, {3, 0.5, 6 * time.Second}} {
		if got := queue.ETAFor(tt.n, tt.rate); got != tt.want {
			t.Errorf("ETAFor(%d, %g) = %s, want %s", tt.n, tt.rate, got, tt.want)
		}
	}
}

// Positions count the more urgent pending work ahead and FIFO order
// within a priority; admission refuses at MaxDepth with a Retry-After
// from the measured drain rate.
func TestPositionsAndAdmission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.New(testenv.Redis(t), queue.Config{MaxDepth: 5, Prefix: "t:"})
	defer q.Close()
	for _, e := range []struct {
		id string
		p  priority.Priority
	}{{"n1", priority.Normal}, {"n2", priority.Normal}, {"c1", priority.Critical}, {"l1", priority.Low}} {
		if err := q.Enqueue(ctx, e.id, e.p, 0); err != nil {
			t.Fatal(err)
		}
	}
	pos, err := q.Positions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"c1": 1, "n1": 2, "n2": 3, "l1": 4}
	for id, w := range want {
		if pos[id] != w {
			t.Errorf("position of %s = %d, want %d (all: %v)", id, pos[id], w, pos)
		}
	}
	if err := q.Admit(ctx); err != nil {
		t.Fatalf("4 of 5: %v", err)
	}
	if err := q.Enqueue(ctx, "n3", priority.Normal, 0); err != nil {
		t.Fatal(err)
	}
	for range 4 { // a measured drain rate of 4 starts in the window
		if err := q.RecordStart(ctx, "x"); err != nil {
			t.Fatal(err)
		}
	}
	err = q.Admit(ctx)
	var full *queue.FullError
	if !errors.As(err, &full) || !errors.Is(err, queue.ErrQueueFull) || full.Depth != 5 || full.RetryAfter < time.Second {
		t.Fatalf("at MaxDepth: %v", err)
	}
	if found, err := q.Cancel(ctx, "n1", priority.Normal); err != nil || !found {
		t.Fatalf("cancel: %v %v", found, err)
	}
	if p, _ := q.Position(ctx, "n2"); p != 2 {
		t.Fatalf("n2 after n1 left: %d", p)
	}
}
