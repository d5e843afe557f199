package progress

import (
	"context"
	"errors"
	"time"

	"bulwark/pkg/job"
)

// ErrNotEnded is WaitEnd's answer when the request has not ended within
// the wait: it is still queued or running.
var ErrNotEnded = errors.New("progress: request has not ended yet")

// Records reads requests' records (the job store).
type Records interface {
	StatusOf(ctx context.Context, id string) (job.Status, error)
	Get(ctx context.Context, id string) (*job.Record, error)
	Events(ctx context.Context, id, after string) ([]job.Event, error)
}

// Ends reports whether an event of type t ends its request.
func Ends(t job.EventType) bool {
	return t == job.EventCompleted || t == job.EventFailed || t == job.EventCancelled
}

// Watch is what a waiter does besides waiting. The zero Watch does
// nothing.
type Watch struct {
	// Idle runs every Every while the wait goes on (a stream's keep-alive
	// line); its error ends the wait.
	Every time.Duration
	Idle  func() error
	// Event, when set, gets every stored event of the request but its
	// ending, in order and each once, from the first: a waiter that
	// arrives late (a resend that joined, a coalesced follower) sees what
	// it missed, e.g. the deltas of an answer already streaming. Its
	// error ends the wait.
	Event func(job.Event) error
}

// WaitEnd waits up to timeout for request id to end and returns its record,
// on the hub's events rather than by polling: the status is read once, then
// again only after a resync (events were lost). The whole record (request,
// embedding, answer) is read once, at the end. The record is ended before
// its ending is published, so the event is never ahead of the store.
func (h *Hub) WaitEnd(ctx context.Context, id string, timeout time.Duration, recs Records, w Watch) (*job.Record, error) {
	sub := h.Await(id)
	defer sub.Close()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var tick <-chan time.Time
	if w.Every > 0 && w.Idle != nil {
		t := time.NewTicker(w.Every)
		defer t.Stop()
		tick = t.C
	}
	seen := ""
	// pass hands ev to w.Event unless seen already; ended reports its end.
	pass := func(ev job.Event) (ended bool, err error) {
		if Ends(ev.Type) {
			return true, nil
		}
		if w.Event == nil || (seen != "" && job.CompareIDs(ev.ID, seen) <= 0) {
			return false, nil
		}
		seen = ev.ID
		return false, w.Event(ev)
	}
	for {
		st, err := recs.StatusOf(ctx, id)
		if err != nil {
			return nil, err
		}
		if w.Event != nil {
			// Everything stored since the last event passed on: read
			// after the status, so all of it when the request has ended.
			evs, err := recs.Events(ctx, id, seen)
			if err != nil {
				return nil, err
			}
			for _, ev := range evs {
				if ended, err := pass(ev); ended || err != nil {
					return endedRecord(ctx, id, recs, err)
				}
			}
		}
		if st.Terminal() {
			return recs.Get(ctx, id)
		}
		for waiting := true; waiting; {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-timer.C:
				return nil, ErrNotEnded
			case <-tick:
				if err := w.Idle(); err != nil {
					return nil, err
				}
			case ev := <-sub.C:
				if sub.Lagged() || ev.Type == "resync" {
					waiting = false // replay from the store
					continue
				}
				if ev.ID == "" {
					continue
				}
				if ended, err := pass(ev); ended || err != nil {
					return endedRecord(ctx, id, recs, err)
				}
			}
		}
	}
}

// endedRecord returns the ended request's record, or err.
func endedRecord(ctx context.Context, id string, recs Records, err error) (*job.Record, error) {
	if err != nil {
		return nil, err
	}
	return recs.Get(ctx, id)
}
