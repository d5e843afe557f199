package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// Far below the limit a fresh read admits without another; the estimate
// counts this process's recent admissions, so from admitNear of the limit
// on (or once the read is stale) every submission reads again.
func TestAdmissionReadsNearTheLimitOrWhenStale(t *testing.T) {
	var a admission
	if a.cheap(100) {
		t.Fatal("admitted without any read")
	}
	a.saw(50, time.Now()) // the read admitted one: estimate 51
	n := 0
	for a.cheap(100) {
		n++
	}
	if n != 28 { // 51 + 28 = 79 < 80; the next would make 80
		t.Fatalf("%d admissions without a read, want 28", n)
	}
	var b admission
	b.saw(0, time.Now().Add(-admitFresh-time.Millisecond))
	if b.cheap(100) {
		t.Fatal("admitted on a stale read")
	}
}

// Admissions a read may have missed (concurrent ones, admitted before it
// saw their tasks) keep counting for two periods, whatever the read said.
func TestAdmissionCountsConcurrentAdmissions(t *testing.T) {
	var a admission
	now := time.Now()
	for range 4 { // four submissions read the depth at once, all see 0
		a.saw(0, now)
	}
	if a.cheap(5) {
		t.Fatal("a fifth submission was admitted on reads that missed the four before it")
	}
}

// The drain rate a refusal's Retry-After rests on is measured: the starts
// of the last window when there are enough, else those kept over the time
// they span — not the keys' capacity, which a slowly draining queue is far
// below — else the slots' holders over the oldest hold; only with nothing
// to measure at all (a cold start) the capacity, Rate's prior.
func TestAdmissionRate(t *testing.T) {
	t.Parallel()
	held := []time.Duration{10 * time.Second, 80 * time.Second, 40 * time.Second, 5 * time.Second}
	for _, tt := range []struct {
		name       string
		recent     int64
		recentSpan time.Duration
		kept       int64
		keptSpan   time.Duration
		ages       []time.Duration
		capacity   float64
		want       float64
	}{
		{"measured window", 40, 20 * time.Second, 100, 100 * time.Second, held, 50, 2},
		{"window capped by capacity", 40, 2 * time.Second, 40, 2 * time.Second, nil, 5, 5},
		{"few recent: the kept ones", 2, 15 * time.Second, 6, 60 * time.Second, held, 50, 0.1},
		{"one kept, just now", 1, 0, 1, 0, nil, 50, 1},
		{"none kept: the holders", 0, 0, 0, 0, held, 50, 0.05},
		{"nothing to measure: the capacity", 0, 0, 0, 0, nil, 50, 50},
		{"nothing to measure, no capacity", 0, 0, 0, 0, nil, 0, FallbackRateDefault},
	} {
		if got := admissionRate(tt.recent, tt.recentSpan, tt.kept, tt.keptSpan, tt.ages, tt.capacity); got != tt.want {
			t.Errorf("%s: rate %g, want %g", tt.name, got, tt.want)
		}
	}
	for _, tt := range []struct {
		name string
		d    drain
		n    int
		want time.Duration
	}{
		{"fast drain: at least a second", newDrain(50, nil), 3, MinRetryAfter},
		{"slow drain", newDrain(0.1, nil), 2, 20 * time.Second},
		{"beyond the longest wait", newDrain(0.01, nil), 20, time.Minute},
		{"nothing drains", newDrain(0, nil), 1, time.Minute},
	} {
		if got := clampRetry(tt.d, tt.n, time.Minute); got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

// A full queue whose last starts are few and old (slow calls hold the
// slots) says so in its Retry-After: tens of seconds, where the keys'
// capacity said a fraction of one. With nothing measured yet (a cold
// start) the capacity stands; with a steady stream of starts, a second.
func TestFullQueueRetryAfterIsTheMeasuredWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	q := New(rdb, Config{MaxDepth: 2, Prefix: "t:", Capacity: 50, MaxWait: 5 * time.Minute})
	defer q.Close()
	for _, id := range []string{"a", "b"} {
		if err := q.Enqueue(ctx, id, priority.Normal, 0); err != nil {
			t.Fatal(err)
		}
	}
	retryAfter := func() time.Duration {
		t.Helper()
		var full *FullError
		if err := q.Admit(ctx); !errors.As(err, &full) {
			t.Fatalf("admit at MaxDepth: %v", err)
		}
		return full.RetryAfter
	}
	if got := retryAfter(); got != MinRetryAfter {
		t.Fatalf("nothing measured yet: Retry-After %s, want the capacity's %s", got, MinRetryAfter)
	}
	// Three starts over the last minute: a drain of 0.05/s, one request
	// every 20 s.
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i, ago := range []time.Duration{60 * time.Second, 40 * time.Second, 20 * time.Second} {
		if err := rdb.ZAdd(ctx, q.startsKey(), redis.Z{Score: float64(now.Add(-ago).UnixMilli()), Member: fmt.Sprint("old-", i)}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got := retryAfter(); got < 15*time.Second || got > 25*time.Second {
		t.Fatalf("three starts in a minute: Retry-After %s, want about 20s", got)
	}
	for i := range 20 {
		if err := q.RecordStart(ctx, fmt.Sprint("now-", i)); err != nil {
			t.Fatal(err)
		}
	}
	if got := retryAfter(); got != MinRetryAfter {
		t.Fatalf("a steady drain: Retry-After %s, want %s", got, MinRetryAfter)
	}
}
