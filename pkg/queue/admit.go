package queue

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Admission reads the queues' depth (a pipeline of 12 reads plus the slot
// waiters' script) at most every admitFresh while this process knows the
// queue to be well below MaxDepth: a profile of the compat path under
// load showed the read on every submission among its largest Redis costs.
// Its estimate is the last depth read plus every submission this process
// admitted in the last two admitFresh periods (those a read may have
// missed: admitted, not enqueued yet when it ran). Near the limit
// (estimate at admitNear of MaxDepth or more) every submission reads the
// depth, as before, so the limit holds as exactly as the
// read-then-enqueue sequence ever allowed; far from it, submissions
// admitted by other API processes are counted at the next read, at most
// admitFresh late.
const (
	admitFresh = 100 * time.Millisecond
	// admitNear is the share of MaxDepth (in percent) from which every
	// submission reads the depth.
	admitNear = 80
)

// admission is the last depth read and what this process admitted
// recently, in two admitFresh buckets.
type admission struct {
	mu    sync.Mutex
	depth int
	read  time.Time
	// cur counts the admissions since bucket began, prev those of the
	// bucket before.
	bucket    time.Time
	cur, prev int
}

// roll moves the buckets forward to now.
func (a *admission) roll(now time.Time) {
	switch since := now.Sub(a.bucket); {
	case since < admitFresh:
	case since < 2*admitFresh:
		a.prev, a.cur, a.bucket = a.cur, 0, a.bucket.Add(admitFresh)
	default:
		a.prev, a.cur, a.bucket = 0, 0, now
	}
}

// cheap admits one submission without reading Redis when the last read is
// fresh and the estimate stays far below max.
func (a *admission) cheap(max int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.roll(now)
	if a.read.IsZero() || now.Sub(a.read) > admitFresh || (a.depth+a.cur+a.prev+1)*100 >= max*admitNear {
		return false
	}
	a.cur++
	return true
}

// saw records a depth read, begun at at, that admitted one submission.
func (a *admission) saw(depth int, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.roll(time.Now())
	a.cur++
	if at.After(a.read) {
		a.depth, a.read = depth, at
	}
}

// Admit returns a *FullError (errors.Is ErrQueueFull) when the queues hold
// MaxDepth requests, with the measured time until there is room as its
// Retry-After (roomIn).
// Below 80 % of MaxDepth an API process decides on a depth it read at most
// admitFresh ago plus what it admitted since, not what other API processes
// admitted: k of them filling an empty queue within admitFresh may
// overshoot MaxDepth by up to (k−1)·80 % of it. Above 80 % each reads the
// depth every time, and concurrent submissions overshoot by at most their
// number.
func (q *Queue) Admit(ctx context.Context) error {
	if q.admit.cheap(q.cfg.MaxDepth) {
		return nil
	}
	at := time.Now()
	d, err := q.Depth(ctx)
	if err != nil {
		return err
	}
	total := 0
	for _, n := range d {
		total += n
	}
	if total < q.cfg.MaxDepth {
		q.admit.saw(total, at)
		return nil
	}
	// Room for one more appears once one request drains; say when a tenth
	// of the queue will have, so that the callers refused together do not
	// all come back to the one free place.
	after, err := q.roomIn(ctx, max(1, (total-q.cfg.MaxDepth)+q.cfg.MaxDepth/10))
	if err != nil {
		return err
	}
	return &FullError{Depth: total, RetryAfter: after}
}

// MinRetryAfter is the shortest Retry-After Bulwark tells a caller.
const MinRetryAfter = time.Second

// A refused caller is told when there will be room: a Retry-After shorter
// than the real wait makes it come back to a full queue and spend its
// retries (an SDK has two) in seconds. The time until n requests have left
// the queue is the n-th slot release of the queue's own ETA model
// (eta.go), on the slots' ages and a drain rate admission measures itself:
// Rate's is meant for positions and falls back to Capacity, the most the
// keys could carry, when the last RateWindow saw fewer than
// minRateSamples starts — exactly when a full queue drains slowly (slots
// held by slow calls, keys cooling, a breaker open), which told callers
// "1 s" while they waited 40. Admission then counts the starts RecordStart
// keeps (five windows) over the time they span; with none at all, the
// slots' holders (each held at least its age, so the drain is at most
// their number over the oldest age); with nothing held either, nothing
// was measured yet (a cold start) and Rate's prior stands. MaxWait, when
// the oldest requests fail at their deadline, bounds it all.

// drainScript reads the starts RecordStart keeps (Rate uses the first
// two figures, admission all four). KEYS[1] starts zset; ARGV[1] window
// ms; ARGV[2] "kept" for the last two. Reply: {starts in the window, ms
// since the oldest of them[, starts kept, ms since the oldest of them]}.
const drainScript = `
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local function since(from)
  local n = redis.call("ZCOUNT", KEYS[1], from, "+inf")
  if n == 0 then return n, 0 end
  local first = redis.call("ZRANGEBYSCORE", KEYS[1], from, "+inf", "WITHSCORES", "LIMIT", 0, 1)
  return n, now - tonumber(first[2])
end
local n, span = since(now - tonumber(ARGV[1]))
if ARGV[2] ~= "kept" then return {n, span} end
local kept, keptSpan = since("-inf")
return {n, span, kept, keptSpan}`

// roomIn returns when n more requests will have left the queue, between
// MinRetryAfter and MaxWait.
func (q *Queue) roomIn(ctx context.Context, n int) (time.Duration, error) {
	v, err := q.rdb.Eval(ctx, drainScript, []string{q.startsKey()}, q.cfg.RateWindow.Milliseconds(), "kept").Int64Slice()
	if err != nil {
		return 0, fmt.Errorf("queue: drain rate: %w", err)
	}
	if len(v) != 4 {
		return 0, fmt.Errorf("queue: drain rate: unexpected reply %v", v)
	}
	occ, err := q.occupancy(ctx)
	if err != nil {
		return 0, err
	}
	rate := admissionRate(v[0], time.Duration(v[1])*time.Millisecond, v[2], time.Duration(v[3])*time.Millisecond,
		occ.Ages, q.cfg.Capacity)
	return clampRetry(newDrain(rate, occ.Ages), n, q.cfg.MaxWait), nil
}

// admissionRate is the drain rate of recent starts spanning recentSpan in
// the last RateWindow or, when they are too few to measure, of the kept
// ones spanning keptSpan; with none kept, the holders of ages over the
// oldest age; with none either, Rate's prior (rateOf with no starts).
// Capped by capacity (0: none), as Rate is.
func admissionRate(recent int64, recentSpan time.Duration, kept int64, keptSpan time.Duration,
	ages []time.Duration, capacity float64) float64 {
	var r float64
	switch {
	case recent >= minRateSamples:
		return rateOf(recent, recentSpan, capacity)
	case kept > 0:
		r = float64(kept) / max(keptSpan.Seconds(), 1)
	case len(ages) > 0:
		r = float64(len(ages)) / max(slices.Max(ages).Seconds(), 1)
	default:
		return rateOf(0, 0, capacity)
	}
	if capacity > 0 {
		r = min(r, capacity)
	}
	return r
}

// clampRetry is d's wait for n slot releases, between MinRetryAfter and
// maxWait; maxWait when nothing drains (no rate).
func clampRetry(d drain, n int, maxWait time.Duration) time.Duration {
	if d.rate <= 0 {
		return maxWait
	}
	return min(max(d.eta(n), MinRetryAfter), maxWait)
}
