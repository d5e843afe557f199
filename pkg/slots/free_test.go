package slots

import (
	"context"
	"testing"
	"time"

	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// Free tells the queue what each priority could take now: CRITICAL's unused
// reserve is never counted for the others.
func TestFreeOf(t *testing.T) {
	t.Parallel()
	cfg := Config{Total: 20, Reserved: map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}}
	for _, tt := range []struct {
		used map[priority.Priority]int
		want map[priority.Priority]int
	}{
		{map[priority.Priority]int{}, map[priority.Priority]int{priority.Critical: 20, priority.High: 15, priority.Normal: 15, priority.Low: 15}},
		{map[priority.Priority]int{priority.Low: 15}, map[priority.Priority]int{priority.Critical: 5, priority.High: 0, priority.Normal: 0, priority.Low: 0}},
		{map[priority.Priority]int{priority.Critical: 7, priority.Normal: 3}, map[priority.Priority]int{priority.Critical: 10, priority.High: 10, priority.Normal: 10, priority.Low: 10}},
	} {
		got := freeOf(cfg, tt.used)
		for p, w := range tt.want {
			if got[p] != w {
				t.Errorf("used %v: free[%s] = %d, want %d", tt.used, p, got[p], w)
			}
		}
	}
}

// Occupancy reports how long each slot in use has been held, oldest first,
// and forgets a slot once it is released: the queue estimates from it when
// the next slots free up.
func TestOccupancyAges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, err := New(testenv.Redis(t), Config{Total: 20, Reserved: map[priority.Priority]int{priority.Critical: 5}, Prefix: "t:" + t.Name() + ":"})
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	a, err := l.TryAcquire(ctx, priority.Low, Waiter{ID: "a", Since: before})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond) // the time whose passing is measured
	bAt := time.Now()
	b, err := l.TryAcquire(ctx, priority.Low, Waiter{ID: "b", Since: bAt})
	if err != nil {
		t.Fatal(err)
	}
	if b.Granted.Before(a.Granted.Add(50*time.Millisecond)) || b.Granted.After(time.Now().Add(10*time.Millisecond)) {
		t.Fatalf("grant times %s and %s: want the second about 60 ms after the first, by Redis's clock", a.Granted, b.Granted)
	}
	o, err := l.Occupancy(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.Ages) != 2 || o.Ages[0]-o.Ages[1] < 50*time.Millisecond || o.Ages[0] > time.Since(before)+10*time.Millisecond {
		t.Fatalf("ages %v: want the first held about 60 ms longer, at most %s", o.Ages, time.Since(before))
	}
	if o.Free[priority.Low] != 13 || o.Free[priority.Critical] != 18 {
		t.Errorf("free %v: want LOW 13 (20 - 2 - CRITICAL's 5), CRITICAL 18", o.Free)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// The younger slot is left: its age is at most the time since it was
	// asked for (however slow this machine is), so under the older one's.
	if o, err = l.Occupancy(ctx); err != nil || len(o.Ages) != 1 || o.Ages[0] > time.Since(bAt)+10*time.Millisecond {
		t.Fatalf("after releasing the older slot: %v, %v; want one age of at most %s", o.Ages, err, time.Since(bAt))
	}
}

// A refused waiter learns how many grants stand before its turn, and the
// deep ones poll less often (at most 40% of WaiterTTL apart).
func TestRefusalSaysHowFarBack(t *testing.T) {
	l, err := New(testenv.Redis(t), Config{Total: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t0 := time.UnixMilli(1_700_000_000_000)
	for i, id := range []string{"a", "b"} {
		if s, _, err := l.try(ctx, priority.Normal, Waiter{ID: id, Since: t0.Add(time.Duration(i) * time.Millisecond)}); err != nil || s == nil {
			t.Fatalf("%s: slot %v, err %v", id, s, err)
		}
	}
	for i, id := range []string{"c", "d", "e"} {
		_, behind, err := l.try(ctx, priority.Normal, Waiter{ID: id, Since: t0.Add(time.Duration(10+i) * time.Millisecond)})
		if err != ErrNoSlot || behind != i+1 {
			t.Fatalf("%s: behind %d, err %v; want %d grants to go", id, behind, err, i+1)
		}
	}
	if got := l.deepPoll(3); got != 30*time.Millisecond {
		t.Errorf("deepPoll(3) = %s, want 30ms", got)
	}
	if got := l.deepPoll(1000); got != 400*time.Millisecond {
		t.Errorf("deepPoll(1000) = %s, want 40%% of the 1s WaiterTTL", got)
	}
}
