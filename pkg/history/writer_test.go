package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/testkit/testenv"
)

// With the writer running, submissions and outcomes written from many
// goroutines all reach PostgreSQL by Close, each outcome after its
// submission; a row PostgreSQL refuses (a NUL in text) costs only itself,
// not the batch it was in; and writes after Close are synchronous again.
func TestWriterBatchesWithoutLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	var dropped atomic.Int32
	s.OnDrop = func() { dropped.Add(1) }
	s.Outbox(testenv.Redis(t), "t:outbox", 10)
	s.Start()
	const n = 300
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := outcome(fmt.Sprintf("req-w%d", i), 1, "")
			if i == 7 {
				rec.State.Result.Content[0].Text = "a\x00b"
			}
			s.Submitted(ctx, &rec.Job, job.StatusQueued, "none")
			s.Finished(ctx, rec, 0.5)
		})
	}
	wg.Wait()
	s.Close()
	for i := range n {
		row, err := s.Get(ctx, fmt.Sprintf("req-w%d", i))
		if i == 7 {
			if err != nil || row.Status != job.StatusQueued {
				t.Fatalf("the refused outcome's row: %+v %v, want its submission only", row, err)
			}
			continue
		}
		if err != nil || row.Status != job.StatusCompleted || row.Response == nil {
			t.Fatalf("row %d after Close: %+v %v", i, row, err)
		}
	}
	if dropped.Load() != 1 {
		t.Fatalf("%d outcomes counted lost, want the refused one", dropped.Load())
	}
	after := outcome("req-after", 1, "")
	s.Finished(ctx, after, 0)
	if _, err := s.Get(ctx, "req-after"); err != nil {
		t.Fatalf("a write after Close: %v", err)
	}
	s.Close() // twice is fine
	if _, err := s.Get(ctx, "req-none"); !errors.Is(err, history.ErrNotFound) {
		t.Fatal(err)
	}
}
