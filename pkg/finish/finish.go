// Package finish ends requests. A request accepted with 202 ends exactly
// once, as completed, failed (with a typed job.Code) or cancelled, and
// every ending goes through Finisher.Finish, whoever ends it: the worker
// (an answer, a provider error, a deadline), the expiry and orphan sweeps,
// a caller's cancel, or the end of the request it was coalesced with. A
// cache hit at intake, which ends before it was ever stored, goes through
// Finisher.FinishNew: the same ending, written with the record in one
// script. Finish writes the terminal record and event (one Lua
// script in pkg/job, which refuses a second ending; the caller is answered
// from it), then the history row and the metrics, stores a provider's
// answer in the cache, and releases the request's coalescing claim.
//
// What the tenant reads about a failure (the record's Reason, the failed
// event, the history row, and through them GET, the event stream and the
// compat endpoints' error bodies) is a fixed text per job.Code naming the
// request id, written here and nowhere else: a provider's answer, a Go
// error or a network error never reaches a tenant, whatever the caller
// passes. The caller's text is the operators' detail: Finish logs it,
// redacted, once per failure with the request id, and keeps it in the
// record's Detail.
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
	"bulwark/pkg/provider"
)

// ErrEnded is returned when the request had already ended (or its record
// expired): nothing was written.
var ErrEnded = errors.New("finish: request already ended")

// Jobs is the live request store.
type Jobs interface {
	Apply(ctx context.Context, id string, c job.Change) (string, error)
	CreateEnded(ctx context.Context, j *job.Job, ev job.Event, idemKey string, end job.Change) (string, bool, error)
}

// History records a request's outcome in PostgreSQL.
type History interface {
	Finished(ctx context.Context, rec *job.Record, costUSD float64)
}

// Answers keeps a provider's answer for identical and similar requests
// (pkg/cache): now, or in a background writer's next batch; then runs once
// the answer is stored (or given up).
type Answers interface {
	StoreAnswer(ctx context.Context, rec *job.Record, then func()) error
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
	// Reason is what happened, for operators; it may quote a provider's
	// answer or an error. Finish keeps it redacted as the record's Detail;
	// the tenant reads the fixed text of Code instead (TenantReason),
	// which quotes Reason only for a deadline or a cancellation, whose
	// text Bulwark writes itself.
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

// Deps are a Finisher's collaborators; History, Answers and Claims may be
// nil.
type Deps struct {
	Jobs    Jobs
	History History
	Answers Answers
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
	return f.finish(ctx, rec, e, func(ctx context.Context, c job.Change) error {
		_, err := f.d.Jobs.Apply(ctx, rec.Job.ID, c)
		if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
			return ErrEnded
		}
		return err
	})
}

// FinishNew stores request j already ended as e says (a cache hit: one
// write, not a create and then an ending) and returns its record. With an
// idempotency key already used by the tenant it stores nothing and returns
// the earlier request's id and created=false.
func (f *Finisher) FinishNew(ctx context.Context, j *job.Job, idemKey string, e Ending) (rec *job.Record, otherID string, created bool, err error) {
	rec = &job.Record{Job: *j, Status: job.StatusQueued}
	err = f.finish(ctx, rec, e, func(ctx context.Context, c job.Change) error {
		otherID, created, err = f.d.Jobs.CreateEnded(ctx, j, job.Event{Type: job.EventQueued}, idemKey, c)
		if err == nil && !created {
			return errNotCreated
		}
		return err
	})
	if errors.Is(err, errNotCreated) {
		return nil, otherID, false, nil
	}
	if err != nil {
		return nil, "", false, err
	}
	return rec, "", true, nil
}

// EndUnstored ends request j as e says without storing a live record: a
// cache hit answered to a caller that waits for the answer and has no
// Idempotency-Key to look it up by again (a compat call). Its history row
// and metrics are written as for any ending, so GET still finds it (from
// history, once the row is written); Redis is not touched at all.
func (f *Finisher) EndUnstored(ctx context.Context, j *job.Job, e Ending) (*job.Record, error) {
	rec := &job.Record{Job: *j, Status: job.StatusQueued}
	if err := f.finish(ctx, rec, e, func(context.Context, job.Change) error { return nil }); err != nil {
		return nil, err
	}
	return rec, nil
}

// keep is how long j's record stays once ended: what intake decided
// (job.Job.KeepEnded), 0 for the store's result TTL.
func keep(j job.Job) time.Duration { return j.KeepEnded }

// errNotCreated stops FinishNew after its write when the idempotency key
// named an earlier request: nothing of j's was stored to account for.
var errNotCreated = errors.New("finish: not created")

// finish ends rec as e says, with write storing the terminal change.
func (f *Finisher) finish(ctx context.Context, rec *job.Record, e Ending, write func(context.Context, job.Change) error) error {
	if !e.Status.Terminal() {
		return fmt.Errorf("finish %s: status %q is not terminal", rec.Job.ID, e.Status)
	}
	st := e.State
	if st.FinishedAt.IsZero() {
		st.FinishedAt = time.Now()
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), opTimeout)
	defer cancel()
	public, detail := "", ""
	if e.Status != job.StatusCompleted {
		public, detail = TenantReason(rec.Job, e.Code, e.Reason), provider.Redact(e.Reason)
	}
	err := write(wctx, job.Change{Status: e.Status, State: &st, Reason: public, Code: e.Code,
		Detail: detail, Event: event(e, st, public), Keep: keep(rec.Job), Join: rec.Job.JoinKey,
		Tenant: rec.Job.Tenant, Idem: rec.Job.IdempotencyKey})
	if err != nil {
		return fmt.Errorf("finish %s: %w", rec.Job.ID, err)
	}
	rec.Status, rec.State, rec.Code, rec.Reason, rec.Detail = e.Status, st, e.Code, public, detail
	if e.Status == job.StatusFailed {
		// The one log line per failure: operators look a tenant's
		// "request req_…" up by it.
		f.d.Logger.Warn("finish: request failed", "request_id", rec.Job.ID, "code", string(e.Code), "detail", detail)
	}
	f.account(wctx, rec)
	return nil
}

// store keeps a provider's answer in the cache once the caller has it
// (the insert, an HNSW index update, is off the answer's path), then runs
// release: the coalescing claim, held until the answer is stored, covers
// the moments in between (an identical request arriving then joins this
// one and takes its answer from the record).
func (f *Finisher) store(ctx context.Context, rec *job.Record, release func()) {
	if f.d.Answers == nil || rec.Status != job.StatusCompleted || rec.State.Cached.Shared() {
		release()
		return
	}
	if err := f.d.Answers.StoreAnswer(ctx, rec, release); err != nil {
		f.d.Logger.Warn("finish: cache store", "request_id", rec.Job.ID, "err", err)
	}
}

// TenantReason is the text a tenant reads about request j ending with
// code: fixed per code, naming the request id the operator looks the
// detail up by. reason, the caller's text, is quoted only for a deadline
// or a cancellation: Bulwark writes those itself (how long it waited, who
// cancelled), from no provider and no error.
func TenantReason(j job.Job, code job.Code, reason string) string {
	switch code {
	case job.CodeDeadline, job.CodeCancelled:
		if reason == "" {
			reason = string(code)
		}
		return fmt.Sprintf("%s (request %s)", reason, j.ID)
	case job.CodeProviderError:
		return fmt.Sprintf("provider_error: the provider refused this request (request %s); "+
			"the operator can look up its answer by this id", j.ID)
	case job.CodeProviderUnavailable:
		return fmt.Sprintf("provider_unavailable: the providers could not answer this request after several attempts (request %s); "+
			"the operator can look it up by this id", j.ID)
	case job.CodeNoRoute:
		return fmt.Sprintf("no_route: no provider key is configured for %s or its fallback (request %s)", j.Route, j.ID)
	case job.CodeInterrupted:
		return fmt.Sprintf("stream_interrupted: the provider's answer broke off after it had begun to stream (request %s); "+
			"it is not retried, since a second call would write a different answer; send the request again", j.ID)
	case job.CodeLost:
		return fmt.Sprintf("lost: Bulwark lost this request before it was answered (request %s); "+
			"submit it again, or ask the operator to look it up by this id", j.ID)
	default:
		return fmt.Sprintf("the request failed (request %s); the operator can look it up by this id", j.ID)
	}
}

// event is the terminal event of an ending; reason is the tenant's text.
func event(e Ending, st job.State, reason string) *job.Event {
	switch e.Status {
	case job.StatusCompleted:
		ev := &job.Event{Type: job.EventCompleted, Result: job.ResultOf(st)}
		if st.ServedRoute != nil {
			ev.Provider, ev.Tier = st.ServedRoute.Provider, st.ServedRoute.Tier
		}
		return ev
	case job.StatusCancelled:
		return &job.Event{Type: job.EventCancelled, Error: reason, Code: e.Code}
	default:
		return &job.Event{Type: job.EventFailed, Error: reason, Code: e.Code}
	}
}

// account writes what follows an ending: metrics, history, the claim.
func (f *Finisher) account(ctx context.Context, rec *job.Record) {
	st, p := rec.State, rec.Job.Priority.String()
	f.d.Metrics.Requests.WithLabelValues(p, string(rec.Status)).Inc()
	cost := 0.0
	if rec.Status == job.StatusCompleted {
		cached := metrics.CachedFalse
		if st.Cached.Shared() {
			cached = metrics.CachedTrue
		}
		f.d.Metrics.RequestDuration.WithLabelValues(p, cached).Observe(time.Since(rec.Job.CreatedAt).Seconds())
		if cached == metrics.CachedFalse && st.Result != nil && st.ServedRoute != nil {
			price := f.d.Price(*st.ServedRoute)
			f.d.Metrics.AddUsage(*st.ServedRoute, st.Result.Usage, price)
			cost = metrics.Cost(price, st.Result.Usage)
			if st.TokensSaved > 0 {
				f.d.Metrics.TokensSaved.WithLabelValues(string(st.ServedRoute.Provider), st.ServedRoute.Tier).Add(float64(st.TokensSaved))
			}
		}
	} else {
		f.d.Metrics.RequestDuration.WithLabelValues(p, metrics.CachedFalse).Observe(time.Since(rec.Job.CreatedAt).Seconds())
	}
	if f.d.History != nil {
		f.d.History.Finished(ctx, rec, cost)
	}
	f.store(ctx, rec, f.release(rec))
}

// release returns what releases rec's coalescing claim: a no-op unless rec
// leads its key. It may run after Finish returned (once the answer is
// stored), so it has a context of its own. A request answered without a
// call of its own never holds the claim (a cache hit at intake answers
// before claiming; a follower never leads; answeredMeanwhile releases the
// claim it took itself), so it costs no Redis round trip.
func (f *Finisher) release(rec *job.Record) func() {
	if f.d.Claims == nil || rec.Job.CacheKey == "" || rec.State.Cached.Shared() {
		return func() {}
	}
	key, id := rec.Job.CacheKey, rec.Job.ID
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		if err := f.d.Claims.Release(ctx, key, id); err != nil {
			f.d.Logger.Warn("finish: release coalescing claim", "request_id", id, "err", err)
		}
	}
}
