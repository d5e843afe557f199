package queue

import (
	"context"
	"sync"
	"time"
)

// spotsMaxAge is how old a snapshot of every queued request's spot may be
// when SpotOf finds a request in it. Computing the spots reads every
// pending list (O(queue depth)): a flood of GETs of queued requests, each
// computing them afresh, cost Redis that much per read. The hub
// recomputes its streams' positions at about this pace too.
const spotsMaxAge = 100 * time.Millisecond

// spotCache is the latest snapshot of the spots, shared by the process's
// readers: one computation at a time, the others wait for its result.
type spotCache struct {
	mu      sync.Mutex
	spots   map[string]Spot // guarded by mu
	at      time.Time       // when spots was read; zero for none
	err     error           // of the last shared read
	running chan struct{}   // closed when the shared read ends; nil for none
}

// recentSpots returns a snapshot at most spotsMaxAge old, reading one (or
// waiting for the read in flight) when there is none; fresh reports that
// it was read for this call or while it waited.
func (q *Queue) recentSpots(ctx context.Context) (spots map[string]Spot, fresh bool, err error) {
	c := &q.spots
	c.mu.Lock()
	if !c.at.IsZero() && time.Since(c.at) < spotsMaxAge {
		defer c.mu.Unlock()
		return c.spots, false, nil
	}
	if wait := c.running; wait != nil {
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.spots, true, c.err
	}
	done := make(chan struct{})
	c.running = done
	c.mu.Unlock()
	// Read for every waiter: this caller going away must not fail them.
	s, err := q.Spots(context.WithoutCancel(ctx))
	c.mu.Lock()
	c.running, c.err = nil, err
	if err == nil {
		c.spots, c.at = s, time.Now()
	}
	c.mu.Unlock()
	close(done)
	return s, true, err
}

// keepSpots makes s, just read, the latest snapshot.
func (q *Queue) keepSpots(s map[string]Spot) {
	q.spots.mu.Lock()
	q.spots.spots, q.spots.at = s, time.Now()
	q.spots.mu.Unlock()
}
