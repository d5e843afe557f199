// Package finish ends requests. A request accepted with 202 ends exactly
// once, as completed, failed (with a typed job.Code) or cancelled, and
// every ending goes through Finisher.Finish, whoever ends it: the worker
// (an answer, a provider error, a deadline), the expiry and orphan sweeps,
// a caller's cancel, a cache hit, or the end of the request it was
// coalesced with. Finish writes the terminal record and event (one Lua
// script in pkg/job, which refuses a second ending), then the history row
// and the metrics, and releases the request's coalescing claim.
//
// Only the terminal write can fail the call: history is best effort (a
// PostgreSQL outage is counted by the history store) and a claim that is
// not released expires with its TTL. A caller that gets an error has ended
// nothing and may try again (asynq retries the task).
package finish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
)

// ErrEnded is returned when the request had already ended (or its record
// expired): nothing was written.
var ErrEnded = errors.New("finish: request already ended")

// Jobs is the live request store.
type Jobs interface {
	Apply(ctx context.Context, id string, c job.Change) (string, error)
}

// History records a request's outcome in PostgreSQL.
type History interface {
	Finished(ctx context.Context, rec *job.Record, costUSD float64)
}

// Claims releases coalescing claims.
type Claims interface {
	Release(ctx context.Context, key, id string) error
}

// Ending is how a request ends.
type Ending struct {
	// Status is completed, failed or cancelled.
	Status job.Status
	// Code says why a request failed or was cancelled ("" when completed).
	Code job.Code
	// Reason is the text for people.
	Reason string
	// State is the request's final state (result, route, attempts…);
	// FinishedAt is set when zero.
	State job.State
}

// Completed is the ending of an answered request.
func Completed(st job.State) Ending { return Ending{Status: job.StatusCompleted, State: st} }

// Failed is the ending of a request that failed for code.
func Failed(st job.State, code job.Code, reason string) Ending {
	return Ending{Status: job.StatusFailed, Code: code, Reason: reason, State: st}
}

// Cancelled is the ending of a request its caller cancelled.
func Cancelled(st job.State, reason string) Ending {
	return Ending{Status: job.StatusCancelled, Code: job.CodeCancelled, Reason: reason, State: st}
}

// Deps are a Finisher's collaborators; History and Claims may be nil.
type Deps struct {
	Jobs    Jobs
	History History
	Claims  Claims
	Metrics *metrics.Metrics
	// Price of a route, for the cost of a provider's answer.
	Price  func(llm.Route) metrics.Price
	Logger *slog.Logger
}

// Finisher ends requests. It is safe for concurrent use.
type Finisher struct{ d Deps }

// New returns a Finisher.
func New(d Deps) *Finisher {
	if d.Metrics == nil {
		d.Metrics = metrics.New(nil)
	}
	if d.Price == nil {
		d.Price = func(llm.Route) metrics.Price { return metrics.Price{} }
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	return &Finisher{d: d}
}

// opTimeout bounds the terminal write when the caller's context is gone
// (a cancelled task still has to record how it ended).
const opTimeout = 5 * time.Second

// Finish ends rec as e says and updates rec to match. It returns ErrEnded
// when the request had already ended, and an error when the terminal write
// failed (nothing was ended then).
func (f *Finisher) Finish(ctx context.Context, rec *job.Record, e Ending) error {
	if !e.Status.Terminal() {
		return fmt.Errorf("finish %s: status %q is not terminal", rec.Job.ID, e.Status)
	}
	st := e.State
	if st.FinishedAt.IsZero() {
		st.FinishedAt = time.Now()
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	_, err := f.d.Jobs.Apply(wctx, rec.Job.ID, job.Change{Status: e.Status, State: &st, Reason: e.Reason, Code: e.Code,
		Event: event(e, st)})
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return fmt.Errorf("finish %s: %w", rec.Job.ID, ErrEnded)
	}
	if err != nil {
		return fmt.Errorf("finish %s: %w", rec.Job.ID, err)
	}
	rec.Status, rec.State, rec.Code, rec.Reason = e.Status, st, e.Code, e.Reason
	f.account(wctx, rec)
	return nil
}

// event is the terminal event of an ending.
func event(e Ending, st job.State) *job.Event {
	switch e.Status {
	case job.StatusCompleted:
		ev := &job.Event{Type: job.EventCompleted, Result: job.ResultOf(st)}
		if st.ServedRoute != nil {
			ev.Provider, ev.Tier = st.ServedRoute.Provider, st.ServedRoute.Tier
		}
		return ev
	case job.StatusCancelled:
		return &job.Event{Type: job.EventCancelled, Error: e.Reason, Code: e.Code}
	default:
		return &job.Event{Type: job.EventFailed, Error: e.Reason, Code: e.Code}
	}
}

// account writes what follows an ending: metrics, history, the claim.
func (f *Finisher) account(ctx context.Context, rec *job.Record) {
	st, p := rec.State, rec.Job.Priority.String()
	f.d.Metrics.Requests.WithLabelValues(p, string(rec.Status)).Inc()
	cost := 0.0
	if rec.Status == job.StatusCompleted {
		cached := metrics.CachedFalse
		if st.Cached != "" && st.Cached != "none" {
			cached = metrics.CachedTrue
		}
		f.d.Metrics.RequestDuration.WithLabelValues(p, cached).Observe(time.Since(rec.Job.CreatedAt).Seconds())
		if cached == metrics.CachedFalse && st.Result != nil && st.ServedRoute != nil {
			price := f.d.Price(*st.ServedRoute)
			f.d.Metrics.AddUsage(*st.ServedRoute, st.Result.Usage, price)
			cost = metrics.Cost(price, st.Result.Usage)
		}
	} else {
		f.d.Metrics.RequestDuration.WithLabelValues(p, metrics.CachedFalse).Observe(time.Since(rec.Job.CreatedAt).Seconds())
	}
	if f.d.History != nil {
		f.d.History.Finished(ctx, rec, cost)
	}
	if f.d.Claims != nil && rec.Job.CacheKey != "" {
		// A no-op unless this request leads its key.
		if err := f.d.Claims.Release(ctx, rec.Job.CacheKey, rec.Job.ID); err != nil {
			f.d.Logger.Warn("finish: release coalescing claim", "request_id", rec.Job.ID, "err", err)
		}
	}
}
