package queue

import (
	"context"
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
// MaxDepth requests, with a Retry-After computed from the drain rate.
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
	rate, err := q.Rate(ctx)
	if err != nil {
		return err
	}
	// Room for one more appears once one request drains; say when a tenth
	// of the queue will have, so retries do not stampede.
	n := max(1, (total-q.cfg.MaxDepth)+q.cfg.MaxDepth/10)
	return &FullError{Depth: total, RetryAfter: ETAFor(n, rate)}
}
