package slots_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
	"bulwark/pkg/slots"
	"bulwark/pkg/testenv"
)

var defaults = map[priority.Priority]int{priority.Critical: 5, priority.High: 10, priority.Normal: 4, priority.Low: 1}

func newLimiter(t *testing.T, rdb redis.Scripter, ttl time.Duration) *slots.Limiter {
	t.Helper()
	l, err := slots.New(rdb, slots.Config{Total: 20, Reserved: defaults, LeaseTTL: ttl, Prefix: "s:"})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// fill takes slots for p until refused and returns how many it got.
func fill(t *testing.T, l *slots.Limiter, p priority.Priority) []*slots.Slot {
	t.Helper()
	var got []*slots.Slot
	for {
		s, err := l.TryAcquire(context.Background(), p)
		if errors.Is(err, slots.ErrNoSlot) {
			return got
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
}

func TestReservationRule(t *testing.T) {
	t.Parallel()
	// From an idle pool: how many slots each priority alone may take.
	for _, tt := range []struct {
		p    priority.Priority
		want int
	}{{priority.Low, 1}, {priority.Normal, 5}, {priority.High, 15}, {priority.Critical, 20}} {
		t.Run(tt.p.String(), func(t *testing.T) {
			t.Parallel()
			l := newLimiter(t, testenv.Redis(t), time.Minute)
			if got := len(fill(t, l, tt.p)); got != tt.want {
				t.Fatalf("%s alone got %d slots, want %d", tt.p, got, tt.want)
			}
		})
	}
}

func TestLowFloodNeverTakesCriticalReserve(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(t, testenv.Redis(t), time.Minute)
	low := fill(t, l, priority.Low)
	normal := fill(t, l, priority.Normal)
	high := fill(t, l, priority.High)
	if len(low) != 1 || len(normal) != 4 || len(high) != 10 {
		t.Fatalf("low %d normal %d high %d", len(low), len(normal), len(high))
	}
	crit := fill(t, l, priority.Critical)
	if len(crit) != 5 {
		t.Fatalf("critical got %d of its 5 reserved", len(crit))
	}
	// Everything is taken; a freed low slot goes to whoever asks, but low
	// itself may not take a second slot while critical's reserve is in use...
	if err := crit[0].Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, priority.Low); !errors.Is(err, slots.ErrNoSlot) {
		t.Fatalf("low took a slot owed to critical: %v", err)
	}
	if _, err := l.TryAcquire(ctx, priority.Critical); err != nil {
		t.Fatalf("critical refused its reserved slot: %v", err)
	}
	used, err := l.InUse(ctx)
	if err != nil || used[priority.Critical] != 5 || used[priority.Low] != 1 {
		t.Fatalf("in use %v %v", used, err)
	}
}

func TestGlobalLimitAcrossProcesses(t *testing.T) {
	t.Parallel()
	opt := testenv.RedisOptions(t)
	var inFlight, peak atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// 4 "processes", each with its own Redis client, 16 callers each.
	for proc := 0; proc < 4; proc++ {
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { rdb.Close() })
		l := newLimiter(t, rdb, time.Minute)
		for g := 0; g < 16; g++ {
			wg.Add(1)
			go func(p priority.Priority) {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					s, err := l.Acquire(ctx, p)
					if err != nil {
						t.Error(err)
						return
					}
					n := inFlight.Add(1)
					for {
						old := peak.Load()
						if n <= old || peak.CompareAndSwap(old, n) {
							break
						}
					}
					time.Sleep(time.Millisecond) // hold the slot like a short provider call
					inFlight.Add(-1)
					if err := s.Release(ctx); err != nil {
						t.Error(err)
					}
				}
			}(priority.All[g%4])
		}
	}
	wg.Wait()
	if p := peak.Load(); p > 20 || p < 10 {
		t.Fatalf("peak in flight %d, want at most 20 (and the pool used)", p)
	}
}

func TestDeadHolderLeaseExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := newLimiter(t, testenv.Redis(t), 200*time.Millisecond)
	if got := len(fill(t, l, priority.Low)); got != 1 {
		t.Fatalf("low got %d", got)
	}
	// The holder "dies" without releasing. Acquire waits for the lease to expire.
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := l.Acquire(ctx, priority.Low); err != nil {
		t.Fatalf("slot of a dead holder never freed: %v", err)
	}
	if time.Since(start) < 100*time.Millisecond {
		t.Fatal("acquired before the lease expired")
	}
}
