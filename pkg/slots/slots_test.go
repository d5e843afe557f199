package slots_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"bulwark/pkg/priority"
	"bulwark/pkg/slots"
	"bulwark/pkg/testkit/testenv"
)

// reserves are the design's defaults, of a Total of 20.
var reserves = map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}

const total = 20

type bundle struct {
	l   *slots.Limiter
	ctx context.Context
	n   atomic.Int64 // waiter ids
}

// setup builds a limiter of 20 slots with the default reserves on the
// test's own Redis database and prefix; cfg may set the TTLs.
func setup(t *testing.T, cfg slots.Config) *bundle {
	t.Helper()
	cfg.Total, cfg.Reserved = total, reserves
	cfg.Prefix = "t:" + t.Name() + ":"
	l, err := slots.New(testenv.Redis(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{l: l, ctx: context.Background()}
}

// waiter returns a new waiter created now.
func (b *bundle) waiter(name string) slots.Waiter {
	return slots.Waiter{ID: fmt.Sprintf("%s-%d", name, b.n.Add(1)), Since: time.Now()}
}

// fill takes slots for p with new waiters until refused, then withdraws
// the refused waiter, and returns the slots taken.
func (b *bundle) fill(t *testing.T, p priority.Priority) []*slots.Slot {
	t.Helper()
	var got []*slots.Slot
	for {
		w := b.waiter(p.String())
		s, err := b.l.TryAcquire(b.ctx, p, w)
		if errors.Is(err, slots.ErrNoSlot) {
			if err := b.l.Leave(b.ctx, p, w.ID); err != nil {
				t.Fatal(err)
			}
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

// mustTry asks once for w and fails the test unless the outcome is want
// (true: granted).
func (b *bundle) mustTry(t *testing.T, p priority.Priority, w slots.Waiter, want bool) *slots.Slot {
	t.Helper()
	s, err := b.l.TryAcquire(b.ctx, p, w)
	switch {
	case err != nil && !errors.Is(err, slots.ErrNoSlot):
		t.Fatal(err)
	case want && err != nil:
		t.Fatalf("%s waiter %s refused, want granted", p, w.ID)
	case !want && err == nil:
		t.Fatalf("%s waiter %s granted, want refused", p, w.ID)
	}
	return s
}

func (b *bundle) release(t *testing.T, s *slots.Slot) {
	t.Helper()
	if err := s.Release(b.ctx); err != nil {
		t.Fatal(err)
	}
}

func (b *bundle) inUse(t *testing.T) map[priority.Priority]int {
	t.Helper()
	used, err := b.l.InUse(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// eventually polls cond until it holds or 10 s pass: for what needs a TTL
// to run out.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10s", what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, not synchronisation
	}
}

func TestAlone(t *testing.T) {
	t.Parallel()
	// Critical's reserve is never lent, so any other priority alone gets
	// 20 - 5; critical alone gets everything.
	for _, tt := range []struct {
		p    priority.Priority
		want int
	}{{priority.Critical, 20}, {priority.High, 15}, {priority.Normal, 15}, {priority.Low, 15}} {
		t.Run(tt.p.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slots.Config{})
			if got := len(b.fill(t, tt.p)); got != tt.want {
				t.Fatalf("%s alone got %d slots, want %d", tt.p, got, tt.want)
			}
			if got := b.inUse(t)[tt.p]; got != tt.want {
				t.Fatalf("InUse[%s] = %d, want %d", tt.p, got, tt.want)
			}
		})
	}
}

func TestLowGetsItsReserveUnderHighFlood(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{})
	high := b.fill(t, priority.High)
	if len(high) != 15 {
		t.Fatalf("high got %d, want 15", len(high))
	}
	// HIGH waiters older than the LOW one: FIFO would put them first, the
	// reserve must not.
	var hw []slots.Waiter
	for range 3 {
		w := b.waiter("high")
		b.mustTry(t, priority.High, w, false)
		hw = append(hw, w)
	}
	low := b.waiter("low")
	b.mustTry(t, priority.Low, low, false)

	b.release(t, high[0])
	b.mustTry(t, priority.High, hw[0], false) // position 2 of 1 available
	b.mustTry(t, priority.Low, low, true)

	// LOW now holds its reserve; the next freed slot goes back to HIGH, in order.
	b.release(t, high[1])
	b.mustTry(t, priority.High, hw[1], false)
	b.mustTry(t, priority.High, hw[0], true)
	if used := b.inUse(t); used[priority.High] != 14 || used[priority.Low] != 1 {
		t.Fatalf("in use %v, want high 14 low 1", used)
	}
}

func TestCriticalNeverWaitsForOthers(t *testing.T) {
	t.Parallel()
	for _, flood := range [][]priority.Priority{
		{priority.Low}, {priority.Normal}, {priority.High}, {priority.Low, priority.Normal, priority.High},
	} {
		t.Run(fmt.Sprint(flood), func(t *testing.T) {
			t.Parallel()
			b := setup(t, slots.Config{})
			held := 0
			for _, p := range flood {
				held += len(b.fill(t, p))
				for range 2 {
					b.mustTry(t, p, b.waiter(p.String()), false)
				}
			}
			if held != 15 {
				t.Fatalf("flood %v holds %d, want 15", flood, held)
			}
			for range 5 {
				b.mustTry(t, priority.Critical, b.waiter("critical"), true)
			}
			b.mustTry(t, priority.Critical, b.waiter("critical"), false) // all 20 taken
		})
	}
}

func TestFIFOBySince(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{})
	normal := b.fill(t, priority.Normal)
	base := time.Now().Add(-time.Minute)
	w1 := slots.Waiter{ID: "c", Since: base}
	w2 := slots.Waiter{ID: "a", Since: base.Add(time.Millisecond)}
	w3 := slots.Waiter{ID: "b", Since: base.Add(2 * time.Millisecond)}
	for _, w := range []slots.Waiter{w3, w1, w2} { // registration order does not matter
		b.mustTry(t, priority.Normal, w, false)
	}
	waiting, err := b.l.Waiting(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(waiting[priority.Normal], ","); got != "c,a,b" {
		t.Fatalf("Waiting[normal] = %s, want c,a,b", got)
	}
	// Each freed slot goes to the oldest, whoever polls first.
	for i, want := range []slots.Waiter{w1, w2, w3} {
		b.release(t, normal[i])
		for _, w := range []slots.Waiter{w3, w2, w1} {
			if w.ID == want.ID {
				b.mustTry(t, priority.Normal, w, true)
				break
			}
			b.mustTry(t, priority.Normal, w, false)
		}
	}
}

func TestExpiredWaiterDoesNotBlock(t *testing.T) {
	t.Parallel()
	const ttl = 500 * time.Millisecond
	b := setup(t, slots.Config{WaiterTTL: ttl})
	normal := b.fill(t, priority.Normal)
	start := time.Now()
	dead := slots.Waiter{ID: "dead", Since: start.Add(-time.Minute)} // first in line, never asks again
	b.mustTry(t, priority.Normal, dead, false)
	live := b.waiter("live")
	b.release(t, normal[0])
	_, err := b.l.TryAcquire(b.ctx, priority.Normal, live)
	if time.Since(start) < ttl && !errors.Is(err, slots.ErrNoSlot) {
		t.Fatalf("live overtook a registered older waiter: %v", err)
	}
	eventually(t, "granted after the dead waiter lapsed", func() bool {
		_, err := b.l.TryAcquire(b.ctx, priority.Normal, live)
		if err != nil && !errors.Is(err, slots.ErrNoSlot) {
			t.Fatal(err)
		}
		return err == nil
	})
	waiting, err := b.l.Waiting(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(waiting[priority.Normal]); n != 0 {
		t.Fatalf("waiting %v after the only live waiter was granted", waiting)
	}
}

func TestExpiredLeaseFreesSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{LeaseTTL: 200 * time.Millisecond})
	b.fill(t, priority.Critical) // until refused: every slot is taken
	// The holders "die" without releasing; Acquire waits for their leases.
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	if _, err := b.l.Acquire(ctx, priority.Low, b.waiter("low")); err != nil {
		t.Fatalf("dead holders' slots never freed: %v", err)
	}
}

func TestRenew(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	b := setup(t, slots.Config{LeaseTTL: ttl})
	kept := b.mustTry(t, priority.Critical, b.waiter("kept"), true)
	dropped := b.mustTry(t, priority.Critical, b.waiter("dropped"), true)
	start := time.Now()
	for time.Since(start) < 3*ttl {
		if err := kept.Renew(b.ctx); err != nil {
			t.Fatalf("renew after %s: %v", time.Since(start), err)
		}
		time.Sleep(ttl / 6) // the holder's renew period, not synchronisation
	}
	if used := b.inUse(t)[priority.Critical]; used != 1 {
		t.Fatalf("%d critical in use after the other lease expired, want the renewed 1", used)
	}
	b.release(t, kept)
	if err := kept.Renew(b.ctx); !errors.Is(err, slots.ErrLost) {
		t.Fatalf("renew after release: %v, want ErrLost", err)
	}
	if err := kept.Release(b.ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if err := dropped.Renew(b.ctx); !errors.Is(err, slots.ErrLost) {
		t.Fatalf("renew of an expired lease: %v, want ErrLost", err)
	}
}

func TestAcquireGivesUpAndLeaves(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{})
	b.fill(t, priority.Normal)
	ctx, cancel := context.WithCancel(b.ctx)
	w := b.waiter("normal")
	done := make(chan error, 1)
	go func() {
		_, err := b.l.Acquire(ctx, priority.Normal, w)
		done <- err
	}()
	eventually(t, "registered", func() bool {
		waiting, err := b.l.Waiting(b.ctx)
		return err == nil && len(waiting[priority.Normal]) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire after cancel: %v, want context.Canceled", err)
	}
	waiting, err := b.l.Waiting(b.ctx)
	if err != nil || len(waiting[priority.Normal]) != 0 {
		t.Fatalf("waiting %v, %v after Acquire gave up", waiting, err)
	}
}

func TestConfigErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		cfg  slots.Config
		want string
	}{
		{slots.Config{Total: -1}, "Config.Total must be at least 1, got -1"},
		{slots.Config{LeaseTTL: -time.Second}, "Config.LeaseTTL must be at least 1ms, got -1s"},
		{slots.Config{WaiterTTL: 10 * time.Millisecond}, "Config.WaiterTTL must be at least 100ms (twice the longest poll interval), got 10ms"},
		{slots.Config{RedisTimeout: -1}, "Config.RedisTimeout must be positive, got -1ns"},
		{slots.Config{Reserved: map[priority.Priority]int{7: 1}}, "Config.Reserved has unknown priority 7"},
		{slots.Config{Reserved: map[priority.Priority]int{priority.High: -2}}, "Config.Reserved[high] must be at least 0, got -2"},
		{slots.Config{Total: 10, Reserved: reserves}, "Config.Reserved sums to 20, more than Config.Total 10"},
	} {
		_, err := slots.New(nil, tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tt.cfg, err, tt.want)
		}
	}
}

// TestConcurrentPriorities hammers one limiter from 30 waiters of each
// priority. A monitor checks every InUse snapshot (one script, so
// consistent) against the rule, and the workers count what they hold.
func TestConcurrentPriorities(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{})
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()

	var c holdCounter
	var wg sync.WaitGroup
	for _, p := range priority.All {
		for range 30 {
			wg.Go(func() { hammer(ctx, t, b, &c, p) })
		}
	}
	stop := make(chan struct{})
	var mon sync.WaitGroup
	mon.Go(func() { monitor(ctx, t, b.l, stop) })
	wg.Wait()
	close(stop)
	mon.Wait()
	if ctx.Err() != nil {
		t.Fatal("the waiters did not finish in time")
	}
	t.Logf("peak in flight %d of %d", c.peak, total)
	if c.peak < total/2 {
		t.Fatalf("peak in flight %d: the pool was hardly used", c.peak)
	}
}

// hammer acquires, holds and releases a slot for p a few times.
func hammer(ctx context.Context, t *testing.T, b *bundle, c *holdCounter, p priority.Priority) {
	for range 5 {
		time.Sleep(rand.N(3 * time.Millisecond)) // think time, so critical's use varies
		c.asking(p, +1)
		s, err := b.l.Acquire(ctx, p, b.waiter(p.String()))
		if err != nil {
			t.Error(err)
			return
		}
		c.hold(t, p, +1)
		time.Sleep(10*time.Millisecond + rand.N(20*time.Millisecond)) // the provider call
		c.hold(t, p, -1)
		if err := s.Release(ctx); err != nil {
			t.Error(err)
		}
		c.asking(p, -1)
	}
}

// holdCounter counts, under one lock, the slots the workers know they hold
// (from grant to just before release: never more than Redis counts) and
// the critical workers between asking and released (never fewer than
// critical's leases). So the rule's bounds must hold for its snapshots too.
type holdCounter struct {
	mu            sync.Mutex
	held, nonCrit int
	critUpper     int
	peak          int
}

func (c *holdCounter) asking(p priority.Priority, d int) {
	if p == priority.Critical {
		c.mu.Lock()
		c.critUpper += d
		c.mu.Unlock()
	}
}

func (c *holdCounter) hold(t *testing.T, p priority.Priority, d int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held += d
	if p != priority.Critical {
		c.nonCrit += d
	}
	c.peak = max(c.peak, c.held)
	if c.held > total {
		t.Errorf("%d held, more than %d", c.held, total)
	}
	if limit := total - max(0, reserves[priority.Critical]-c.critUpper); c.nonCrit > limit {
		t.Errorf("%d non-critical held with at most %d critical: into critical's reserve", c.nonCrit, c.critUpper)
	}
}

// monitor checks InUse snapshots until stop closes.
func monitor(ctx context.Context, t *testing.T, l *slots.Limiter, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		used, err := l.InUse(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		crit := used[priority.Critical]
		nonCrit := used[priority.High] + used[priority.Normal] + used[priority.Low]
		if crit+nonCrit > total {
			t.Errorf("in use %v: more than %d", used, total)
		}
		if nonCrit > total-max(0, reserves[priority.Critical]-crit) {
			t.Errorf("in use %v: non-critical holds part of critical's unused reserve", used)
		}
	}
}

// A LOW request that a CRITICAL one now waits on (coalesced) is promoted:
// it takes CRITICAL's reserve although LOW's share is full, and counts as
// CRITICAL while it holds it.
func TestPromotedWaiterTakesTheUrgentSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, slots.Config{})
	b.fill(t, priority.Low) // LOW's 15: only CRITICAL's reserve is left
	w := b.waiter("low-leader")
	b.mustTry(t, priority.Low, w, false)
	if err := b.l.Promote(b.ctx, w.ID, priority.Critical, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := b.l.Promote(b.ctx, w.ID, priority.Normal, time.Minute); err != nil { // less urgent: ignored
		t.Fatal(err)
	}
	s := b.mustTry(t, priority.Low, w, true)
	if used := b.inUse(t); used[priority.Critical] != 1 || used[priority.Low] != 15 {
		t.Errorf("in use %v: want the promoted request counted as CRITICAL", used)
	}
	b.release(t, s)
	// The promotion ends with the grant: the same waiter asks as LOW again.
	b.mustTry(t, priority.Low, w, false)
}
