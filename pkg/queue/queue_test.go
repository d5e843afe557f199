package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/slots"
	"bulwark/pkg/testkit/testenv"
)

func TestETAFor(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		n    int
		rate float64
		want time.Duration
	}{{0, 1, 0}, {1, 1, time.Second}, {10, 4, 2500 * time.Millisecond}, {3, 0.5, 6 * time.Second}, {1, 3, 333 * time.Millisecond}, {5, 0, 0}} {
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
	spots, err := q.Spots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"c1": 1, "n1": 2, "n2": 3, "l1": 4}
	for id, w := range want {
		if spots[id].Position != w {
			t.Errorf("position of %s = %d, want %d (all: %v)", id, spots[id].Position, w, spots)
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
	if sp, _ := q.SpotOf(ctx, "n2"); sp.Position != 2 {
		t.Fatalf("n2 after n1 left: %d", sp.Position)
	}
}

// fakeWaiters stands in for slots.Limiter: requests a worker took from
// asynq that wait for a global slot.
type fakeWaiters struct {
	waiting map[priority.Priority][]string
	free    map[priority.Priority]int
}

func (f fakeWaiters) Waiting(context.Context) (map[priority.Priority][]string, error) {
	return f.waiting, nil
}

// Occupancy says nothing about the ages of the slots in use: the ETA is the
// plain drain-rate one.
func (f fakeWaiters) Occupancy(context.Context) (slots.Occupancy, error) {
	return slots.Occupancy{Free: f.free}, nil
}

// lateWaiter is a worker that took "late" from asynq and asks for its slot
// only after the first read of the line.
type lateWaiter struct {
	fakeWaiters
	reads atomic.Int32
}

func (l *lateWaiter) Waiting(ctx context.Context) (map[priority.Priority][]string, error) {
	if l.reads.Add(1) == 1 {
		return l.fakeWaiters.Waiting(ctx)
	}
	return map[priority.Priority][]string{priority.Low: {"late"}}, nil
}

// A request caught between asynq's list and the slots' line, while others
// are queued, is read again and gets its place (waiters before pending)
// rather than "started"; with
// nothing queued a request not found has started, and is read once.
func TestSpotOfRereadsARequestBetweenQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := &lateWaiter{fakeWaiters: fakeWaiters{free: map[priority.Priority]int{}}}
	q := queue.New(testenv.Redis(t), queue.Config{Prefix: "t:", Waiters: w})
	defer q.Close()
	if err := q.Enqueue(ctx, "other", priority.Low, 0); err != nil {
		t.Fatal(err)
	}
	if sp, err := q.SpotOf(ctx, "late"); err != nil || sp.Position != 1 || sp.ETA == 0 || w.reads.Load() != 2 {
		t.Fatalf("caught between: %+v %v after %d reads", sp, err, w.reads.Load())
	}

	idle := &lateWaiter{fakeWaiters: fakeWaiters{free: map[priority.Priority]int{priority.Low: 1}}}
	q2 := queue.New(testenv.Redis(t), queue.Config{Prefix: "t2:", Waiters: idle})
	defer q2.Close()
	if sp, err := q2.SpotOf(ctx, "started"); err != nil || sp.Position != 0 || idle.reads.Load() != 1 {
		t.Fatalf("nothing queued: %+v %v after %d reads", sp, err, idle.reads.Load())
	}
}

// A request waiting for a slot left asynq before any pending one of its
// priority: it is ahead of them, behind every more urgent request, and it
// counts towards the depth admission limits.
func TestSlotWaitersAreQueued(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := fakeWaiters{waiting: map[priority.Priority][]string{priority.Normal: {"wn1", "wn2"}, priority.Critical: {"wc1"}},
		free: map[priority.Priority]int{priority.Low: 3}}
	q := queue.New(testenv.Redis(t), queue.Config{MaxDepth: 6, Prefix: "t:", Waiters: w})
	defer q.Close()
	for _, e := range []struct {
		id string
		p  priority.Priority
	}{{"n1", priority.Normal}, {"c1", priority.Critical}, {"l1", priority.Low}} {
		if err := q.Enqueue(ctx, e.id, e.p, 0); err != nil {
			t.Fatal(err)
		}
	}
	spots, err := q.Spots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"wc1": 1, "c1": 2, "wn1": 3, "wn2": 4, "n1": 5, "l1": 6}
	for id, p := range want {
		if spots[id].Position != p {
			t.Errorf("position of %s = %d, want %d (all: %v)", id, spots[id].Position, p, spots)
		}
	}
	// l1 is sixth, but three slots LOW could take are free: its turn is
	// third. Those three slots are about to be taken (holds of age 0, a
	// mean hold of 3 slots / 1/s, the fallback rate, spread over
	// [0.3, 1.7] of it): the first release is expected at 1.6 s, then one
	// a second.
	if got := spots["l1"].ETA; got != 3600*time.Millisecond {
		t.Errorf("ETA of l1 = %s, want 3.6s (turn 3: 1.6 s + 2 releases at 1/s)", got)
	}
	if got := spots["n1"].ETA; got != 5600*time.Millisecond {
		t.Errorf("ETA of n1 = %s, want 5.6s (no free NORMAL slot: turn 5)", got)
	}
	if err := q.Admit(ctx); !errors.Is(err, queue.ErrQueueFull) {
		t.Fatalf("6 waiting of 6: Admit = %v, want queue full", err)
	}
}

// Before anything was measured the ETA assumes the keys' capacity; a burst
// of starts (slots filled at once) never makes it faster than that.
func TestRateUsesCapacity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.New(testenv.Redis(t), queue.Config{Prefix: "t:", Capacity: 8})
	defer q.Close()
	if r, err := q.Rate(ctx); err != nil || r != 8 {
		t.Fatalf("rate before any start = %v, %v; want the capacity 8", r, err)
	}
	for i := range 20 { // 20 starts within a second
		if err := q.RecordStart(ctx, fmt.Sprint("burst-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := q.Rate(ctx); err != nil || r != 8 {
		t.Fatalf("rate after a burst = %v, %v; want capped at 8", r, err)
	}
}

// A pending request older than the slot waiters of its priority is ahead of
// them: the slots serve the oldest first once a worker takes it from asynq.
// Free slots go to the first to ask: waiters, then pending requests in
// asynq's order, whatever their age.
func TestTurnOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Now()
	ids := make([]string, 8) // ids[ms]: created ms after t0
	for ms := range ids {
		ids[ms] = job.NewID(t0.Add(time.Duration(ms) * time.Millisecond))
	}
	id := func(ms int) string { return ids[ms] }
	for _, tt := range []struct {
		name             string
		waiting, pending []string // pending in enqueue order
		free             int
		want             []string
	}{
		{"older pending overtakes", []string{id(1), id(2)}, []string{id(0)}, 0, []string{id(0), id(1), id(2)}},
		{"free slots go in asynq's order", nil, []string{id(5), id(3), id(4), id(1)}, 2, []string{id(5), id(3), id(1), id(4)}},
		{"waiters ask first", []string{id(7)}, []string{id(2), id(1)}, 1, []string{id(7), id(1), id(2)}},
	} {
		w := fakeWaiters{waiting: map[priority.Priority][]string{priority.Low: tt.waiting}, free: map[priority.Priority]int{priority.Low: tt.free}}
		q := queue.New(testenv.Redis(t), queue.Config{Prefix: "t:" + tt.name + ":", Waiters: w})
		for _, p := range tt.pending {
			if err := q.Enqueue(ctx, p, priority.Low, 0); err != nil {
				t.Fatal(err)
			}
		}
		spots, err := q.Spots(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for i, w := range tt.want {
			if spots[w].Position != i+1 {
				t.Errorf("%s: position of %s = %d, want %d (all: %v)", tt.name, w, spots[w].Position, i+1, spots)
			}
		}
		_ = q.Close()
	}
}

// A pending task promoted to a more urgent priority leaves its queue for
// that one; a less urgent "promotion" or an unknown task changes nothing.
func TestPromote(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	q := queue.New(testenv.Redis(t), queue.Config{Prefix: "t:"})
	defer q.Close()
	for _, e := range []struct {
		id string
		p  priority.Priority
	}{{"n1", priority.Normal}, {"l1", priority.Low}} {
		if err := q.Enqueue(ctx, e.id, e.p, 0); err != nil {
			t.Fatal(err)
		}
	}
	if moved, err := q.Promote(ctx, "l1", priority.Low, priority.Critical); err != nil || !moved {
		t.Fatalf("promote l1: %v %v", moved, err)
	}
	d, err := q.Depth(ctx)
	if err != nil || d[priority.Critical] != 1 || d[priority.Low] != 0 {
		t.Fatalf("depths after promotion %v %v: want l1 in CRITICAL", d, err)
	}
	if sp, _ := q.SpotOf(ctx, "l1"); sp.Position != 1 {
		t.Errorf("promoted l1 at position %d, want 1 (ahead of NORMAL)", sp.Position)
	}
	for _, tt := range []struct {
		id       string
		from, to priority.Priority
	}{{"n1", priority.Normal, priority.Low}, {"nope", priority.Low, priority.High}, {"n1", priority.Low, priority.High}} {
		if moved, err := q.Promote(ctx, tt.id, tt.from, tt.to); err != nil || moved {
			t.Errorf("promote %s %s→%s: %v %v, want nothing moved", tt.id, tt.from, tt.to, moved, err)
		}
	}
}

// countingWaiters counts the computations of the spots (each reads the
// slots' line once).
type countingWaiters struct {
	fakeWaiters
	reads atomic.Int32
}

func (c *countingWaiters) Waiting(ctx context.Context) (map[priority.Priority][]string, error) {
	c.reads.Add(1)
	return c.fakeWaiters.Waiting(ctx)
}

// Reads of queued requests' spots share the process's latest snapshot: a
// flood of 200 concurrent reads computes the spots (every pending list)
// about once, not 200 times, and each still gets its own place.
func TestSpotOfSharesOneSnapshot(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := &countingWaiters{fakeWaiters: fakeWaiters{free: map[priority.Priority]int{}}}
	q := queue.New(testenv.Redis(t), queue.Config{Prefix: "t:", Waiters: w})
	defer q.Close()
	for _, id := range []string{"a", "b", "c"} {
		if err := q.Enqueue(ctx, id, priority.Low, 0); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	var wrong atomic.Int32
	for i := range 200 {
		wg.Go(func() {
			id := []string{"a", "b", "c"}[i%3]
			if sp, err := q.SpotOf(ctx, id); err != nil || sp.Position != i%3+1 {
				wrong.Add(1)
			}
		})
	}
	wg.Wait()
	// One snapshot serves every read made within its 100 ms; a slow
	// machine may need a few.
	if n := w.reads.Load(); wrong.Load() != 0 || n > 10 {
		t.Fatalf("%d of 200 reads got a wrong place; the spots were computed %d times", wrong.Load(), n)
	}
}
