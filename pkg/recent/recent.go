// Package recent shares a value that is costly to compute among the
// goroutines of a process: computed at most once per MaxAge, one
// computation at a time, the others waiting for its result. A flood of
// readers (readiness probes, reads of queue positions) then costs the
// store behind the value one computation per MaxAge, not one each.
//
// golang.org/x/sync/singleflight shares a computation in flight but keeps
// nothing after it; the time the result stays shared is what bounds a
// flood.
package recent

import (
	"context"
	"sync"
	"time"
)

// Value is a shared, recently computed value. Set MaxAge and Load before
// the first Get; a Value must not be copied after.
type Value[T any] struct {
	// MaxAge is how old a value Get may return.
	MaxAge time.Duration
	// Load computes the value. It runs detached from the cancellation of
	// the Get that started it (other readers wait for its result): it
	// bounds itself.
	Load func(ctx context.Context) (T, error)

	mu      sync.Mutex
	v       T             // guarded by mu
	at      time.Time     // when v was computed; zero for never
	err     error         // of the last load
	running chan struct{} // closed when the load in flight ends; nil for none
}

// Get returns a value at most MaxAge old, loading one (or waiting for the
// load in flight) when there is none; fresh reports that it was loaded
// during this call. When ctx ends first it returns the last value, if
// any, with ctx's error.
func (r *Value[T]) Get(ctx context.Context) (v T, fresh bool, err error) {
	r.mu.Lock()
	if !r.at.IsZero() && time.Since(r.at) < r.MaxAge {
		defer r.mu.Unlock()
		return r.v, false, nil
	}
	if wait := r.running; wait != nil {
		r.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.v, false, ctx.Err()
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.v, true, r.err
	}
	done := make(chan struct{})
	r.running = done
	r.mu.Unlock()
	v, err = r.Load(context.WithoutCancel(ctx))
	r.mu.Lock()
	r.running, r.err = nil, err
	if err == nil {
		r.v, r.at = v, time.Now()
	}
	r.mu.Unlock()
	close(done)
	return v, true, err
}

// Put makes v, just computed elsewhere, the latest value.
func (r *Value[T]) Put(v T) {
	r.mu.Lock()
	r.v, r.at = v, time.Now()
	r.mu.Unlock()
}
