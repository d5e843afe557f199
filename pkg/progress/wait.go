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
}

// Ends reports whether an event of type t ends its request.
func Ends(t job.EventType) bool {
	return t == job.EventCompleted || t == job.EventFailed || t == job.EventCancelled
}

// Idle is what a waiter does while nothing happens: Do every Every (a
// stream's keep-alive line); its error ends the wait. The zero Idle does
// nothing.
type Idle struct {
	Every time.Duration
	Do    func() error
}

// WaitEnd waits up to timeout for request id to end and returns its record,
// on the hub's events rather than by polling: the status is read once, then
// again only after a resync (events were lost). The whole record (request,
// embedding, answer) is read once, at the end. The record is ended before
// its ending is published, so the event is never ahead of the store.
func (h *Hub) WaitEnd(ctx context.Context, id string, timeout time.Duration, recs Records, idle Idle) (*job.Record, error) {
	sub := h.Await(id)
	defer sub.Close()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var tick <-chan time.Time
	if idle.Every > 0 && idle.Do != nil {
		t := time.NewTicker(idle.Every)
		defer t.Stop()
		tick = t.C
	}
	for {
		st, err := recs.StatusOf(ctx, id)
		if err != nil {
			return nil, err
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
				if err := idle.Do(); err != nil {
					return nil, err
				}
			case ev := <-sub.C:
				if ev.ID != "" && Ends(ev.Type) {
					return recs.Get(ctx, id)
				}
				waiting = ev.Type != "resync" && !sub.Lagged()
			}
		}
	}
}
