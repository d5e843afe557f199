// Package dispatch is the worker's task handler: layers 2 to 5 for one
// request. It takes a global slot for the request's priority, asks the
// breakers and the key pool for a route and a key, calls the provider,
// falls back to the equivalent tier of the other provider, and when every
// route is exhausted re-enqueues the request with a delay equal to the
// earliest time capacity returns. It never hot-loops and never drops a
// request: every path ends in completed, failed (with a reason), or a
// delayed retry that asynq does not count as a failure.
//
// Error classes (pkg/llm) drive every decision, through one table
// (consequences in route.go):
//
//	rate_limited       key cools (keypool), route breaker counts a failure, next key
//	  capacity full    (a provisioned deployment's 429) the key waits its Retry-After
//	                   (keypool.Full, no escalation), no breaker, next key
//	quota, auth        key disabled until an operator re-enables it, alert, next key
//	overloaded         route breaker counts a failure, next provider (no key cooldown)
//	model_unavailable  route breaker counts a failure, next provider
//	transient          jittered backoff, next key; after a few, asynq retry
//	permanent          the request fails at once (provider_error); the provider's
//	                   message goes to the operators' log, never to the caller
//
// # Waiting for capacity
//
// A request waits for capacity in three ways, by how long the wait is:
//
//   - up to PaceWait (default 2 s): it holds its global slot and waits in
//     the route's key line (keypool.InLine), most urgent first, then
//     oldest first, and calls at the moment a key's bucket has room for
//     it, at exactly the keys' pace;
//   - up to HoldWait (default 10 s): it gives its slot back and waits in
//     the worker, then queues for a slot again, still ordered by its
//     creation time (pkg/slots);
//   - longer (every route shut by breakers or cooling keys): it goes back
//     to asynq with a delay until the earliest capacity, which does not
//     count as a failure.
package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/breaker"
	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
	"bulwark/pkg/slots"
)

// KeyPool is the part of keypool.Pool the dispatcher uses.
type KeyPool interface {
	Acquire(ctx context.Context, route llm.Route, estTokens int, opts ...keypool.AcquireOption) (*keypool.Lease, error)
	Success(ctx context.Context, l *keypool.Lease, usage llm.Usage, rl llm.RateLimit) error
	Failure(ctx context.Context, l *keypool.Lease, a keypool.Action, callErr error) error
	Release(ctx context.Context, l *keypool.Lease) error
	Return(ctx context.Context, l *keypool.Lease) error
	Leave(ctx context.Context, route llm.Route, id string) error
}

// Breakers is the part of breaker.Set the dispatcher uses.
type Breakers interface {
	Allow(ctx context.Context, name string) (*breaker.Permit, error)
}

// Slots is the global concurrency limiter.
type Slots interface {
	Acquire(ctx context.Context, p priority.Priority, w slots.Waiter) (*slots.Slot, error)
}

// Jobs is the live request store.
type Jobs interface {
	// GetWithEmbedding: the cache write after the call needs the prompt's
	// embedding, computed once by the API.
	GetWithEmbedding(ctx context.Context, id string) (*job.Record, error)
	Apply(ctx context.Context, id string, c job.Change) (string, error)
}

// Starts records dequeues for the drain rate and position updates.
type Starts interface {
	RecordStart(ctx context.Context, id string) error
}

// Finisher ends requests (pkg/finish): the record, history, metrics and
// claims in one place. An error means nothing was ended; finish.ErrEnded
// that someone else ended the request first.
type Finisher interface {
	Finish(ctx context.Context, rec *job.Record, e finish.Ending) error
}

// Alerter receives alert-worthy conditions (a key disabled for quota).
type Alerter interface {
	KeyDisabled(ctx context.Context, keyID string, route llm.Route, reason string)
}

// Dispatcher handles bulwark:call tasks. It is safe for concurrent use.
type Dispatcher struct {
	cfg      Config
	jobs     Jobs
	starts   Starts
	slots    Slots
	pool     KeyPool
	breakers Breakers
	finisher Finisher
	alerter  Alerter
	metrics  *metrics.Metrics
	logger   *slog.Logger

	mu     sync.Mutex
	active map[priority.Priority]int // tasks being worked on, guarded by mu
}

// Deps are the dispatcher's collaborators. Alerter may be nil.
type Deps struct {
	Jobs     Jobs
	Starts   Starts
	Slots    Slots
	Pool     KeyPool
	Breakers Breakers
	Finisher Finisher
	Alerter  Alerter
	Metrics  *metrics.Metrics
	Logger   *slog.Logger
}

// New returns a dispatcher.
func New(cfg Config, d Deps) *Dispatcher {
	cfg = cfg.WithDefaults()
	if d.Metrics == nil {
		d.Metrics = metrics.New(nil)
	}
	return &Dispatcher{cfg: cfg, jobs: d.Jobs, starts: d.Starts, slots: d.Slots, pool: d.Pool,
		breakers: d.Breakers, finisher: d.Finisher, alerter: d.Alerter, metrics: d.Metrics, logger: d.Logger,
		active: map[priority.Priority]int{}}
}

// waitError re-enqueues a task after Delay without counting a failure.
type waitError struct{ Delay time.Duration }

func (e *waitError) Error() string { return fmt.Sprintf("waiting %s for provider capacity", e.Delay) }

// transientError retries a task after Delay and counts a failure.
type transientError struct {
	Delay time.Duration
	Err   error
}

func (e *transientError) Error() string { return "transient: " + e.Err.Error() }
func (e *transientError) Unwrap() error { return e.Err }

// IsFailure tells asynq that waiting for capacity is not a failure: the
// task's retry count stays, so a request may wait out 429s until its
// deadline, however many times that takes.
func IsFailure(err error) bool {
	var w *waitError
	return !errors.As(err, &w)
}

// RetryDelay gives asynq the delay the handler computed.
func RetryDelay(n int, err error, _ *asynq.Task) time.Duration {
	var w *waitError
	if errors.As(err, &w) {
		return w.Delay
	}
	var t *transientError
	if errors.As(err, &t) {
		return t.Delay
	}
	return backoff(n)
}

// backoff is the delay before retry n of a task that failed for another
// reason (a Redis hiccup, a worker that died: asynq.ErrLeaseExpired):
// 500 ms doubling per retry, at most 30 s, jittered ±25%. asynq's default
// (n^4 + 15 s + up to 30(n+1) s) would keep a request whose worker died
// waiting more than a minute for nothing.
func backoff(n int) time.Duration {
	d := min(500*time.Millisecond<<min(n, 10), 30*time.Second)
	return d*3/4 + rand.N(d/2+1)
}

// ProcessTask handles one bulwark:call task.
func (d *Dispatcher) ProcessTask(ctx context.Context, t *asynq.Task) error {
	var p queue.Payload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.ID == "" {
		return fmt.Errorf("dispatch: bad payload: %v: %w", err, asynq.SkipRetry)
	}
	log := d.logger.With("request_id", p.ID)
	rec, err := d.jobs.GetWithEmbedding(ctx, p.ID)
	if errors.Is(err, job.ErrNotFound) {
		log.Warn("dispatch: request record is gone; dropping task")
		return nil
	}
	if err != nil {
		return fmt.Errorf("dispatch: %w", err) // Redis hiccup: asynq retries
	}
	if rec.Status.Terminal() {
		return nil
	}
	if rec.State.Streamed {
		// Its worker stopped while the answer streamed (stream.go): the
		// caller holds part of it, and a new call would write another.
		return d.fail(ctx, rec, job.CodeInterrupted,
			"stream_interrupted: the worker streaming its answer stopped before the end", log)
	}
	if time.Now().After(rec.Job.Deadline) {
		return d.fail(ctx, rec, job.CodeDeadline, deadlineReason(rec, "before it could start"), log)
	}
	return d.run(ctx, rec, t, log)
}

func deadlineReason(rec *job.Record, what string) string {
	return fmt.Sprintf("deadline_exceeded: waited %s (queue_max_wait %s) %s",
		time.Since(rec.Job.CreatedAt).Round(time.Second), rec.Job.Deadline.Sub(rec.Job.CreatedAt).Round(time.Second), what)
}

// enter admits a task to this process's work unless its priority's cap
// is reached.
func (d *Dispatcher) enter(p priority.Priority) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if limit := d.cfg.MaxActive[p]; limit > 0 && d.active[p] >= limit {
		return false
	}
	d.active[p]++
	return true
}

func (d *Dispatcher) leave(p priority.Priority) {
	d.mu.Lock()
	d.active[p]--
	d.mu.Unlock()
}

func (d *Dispatcher) run(ctx context.Context, rec *job.Record, t *asynq.Task, log *slog.Logger) error {
	p := rec.Job.Priority
	if !d.enter(p) {
		// Back to the queue, not a failure and not a status change.
		delay := d.cfg.SlotBusyDelay/2 + rand.N(d.cfg.SlotBusyDelay)
		return &waitError{Delay: delay}
	}
	defer d.leave(p)
	for {
		out, done, err := d.attempt(ctx, rec, log)
		if done {
			return err
		}
		switch {
		case out.resp != nil:
			return d.complete(ctx, rec, out, log)
		case ctx.Err() != nil:
			return nil // cancelled: the API already recorded it, or shutdown re-queues
		case out.permanent != nil:
			return d.fail(ctx, rec, out.code, string(out.code)+": "+out.permanent.Error(), log)
		case out.transient != nil && !out.exhausted:
			return d.retryTransient(ctx, rec, t, out.transient, log)
		case out.retryAfter > d.cfg.HoldWait:
			return d.wait(ctx, rec, out.retryAfter, log)
		}
		// A short wait for capacity: hold the task here, without a slot,
		// so its place (creation time) in the slot queue is kept and no
		// asynq round trip (whole-second retry times) delays it.
		if held, err := d.hold(ctx, rec, out.retryAfter, log); !held {
			return err
		}
	}
}

// attempt takes a global slot, marks the request running and tries its
// routes once. done reports that the task ended (err is then the
// handler's result).
func (d *Dispatcher) attempt(ctx context.Context, rec *job.Record, log *slog.Logger) (out outcome, done bool, err error) {
	slotCtx, cancel := context.WithDeadline(ctx, rec.Job.Deadline)
	slot, err := d.slots.Acquire(slotCtx, rec.Job.Priority, slots.Waiter{ID: rec.Job.ID, Since: rec.Job.CreatedAt})
	// The request's own deadline passed only if slotCtx says so: a Redis
	// call that timed out (its master down) wraps DeadlineExceeded too, and
	// must not fail a request minutes from its deadline.
	expired := slotCtx.Err() != nil
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return out, true, nil // cancelled by the caller or shutting down; asynq handles the task
		}
		if expired {
			return out, true, d.fail(ctx, rec, job.CodeDeadline, deadlineReason(rec, "waiting for a free provider slot"), log)
		}
		return out, true, fmt.Errorf("dispatch: slot: %w", err)
	}
	stop := d.keep(ctx, slot, log)
	defer func() {
		stop()
		if err := slot.Release(context.WithoutCancel(ctx)); err != nil {
			log.Warn("dispatch: release slot", "err", err)
		}
	}()
	first := rec.State.StartedAt.IsZero()
	st := rec.State
	st.Attempts++
	if first {
		// When its turn came, by Redis's clock: the order requests start
		// in is the slots' order, not the moment this process got round
		// to writing it (a loaded machine may let one goroutine wait a
		// few hundred milliseconds).
		st.StartedAt = slot.Granted
		if st.StartedAt.IsZero() {
			st.StartedAt = time.Now()
		}
	}
	st.RetryAt = time.Time{}
	rec.State = st
	_, err = d.jobs.Apply(ctx, rec.Job.ID, job.Change{Status: job.StatusRunning, State: &st, Tenant: rec.Job.Tenant,
		Event: &job.Event{Type: job.EventStarted, Provider: rec.Job.Route.Provider, Tier: rec.Job.Route.Tier, Attempt: st.Attempts}})
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return out, true, nil // cancelled while it waited for a slot
	}
	if err != nil {
		return out, true, fmt.Errorf("dispatch: mark running: %w", err)
	}
	if first {
		// The drain rate and the queue positions count requests leaving
		// the queue for good, not re-checks.
		if err := d.starts.RecordStart(ctx, rec.Job.ID); err != nil {
			log.Warn("dispatch: record start", "err", err)
		}
	}
	return d.callRoutes(ctx, rec, slot.Priority, log), false, nil
}

// keep renews slot's lease every SlotRenew until the returned stop is
// called, so a slot outlives any call it guards while a dead worker's slot
// still expires after one lease.
func (d *Dispatcher) keep(ctx context.Context, slot *slots.Slot, log *slog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(d.cfg.SlotRenew)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := slot.Renew(ctx); err != nil && ctx.Err() == nil {
					log.Warn("dispatch: renew slot", "err", err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// hold waits after inside the worker for capacity to return, telling the
// caller; it reports false when the task ended instead (cancelled, or the
// deadline would pass first), with the handler's error.
func (d *Dispatcher) hold(ctx context.Context, rec *job.Record, after time.Duration, log *slog.Logger) (bool, error) {
	after = max(after, d.cfg.MinWait)
	if time.Now().Add(after).After(rec.Job.Deadline) {
		return false, d.fail(ctx, rec, job.CodeDeadline,
			deadlineReason(rec, fmt.Sprintf("and no provider route has capacity for another %s", after.Round(time.Second))), log)
	}
	st := rec.State
	st.RetryAt = time.Now().Add(after)
	secs := int((after + time.Second - 1) / time.Second)
	_, err := d.jobs.Apply(ctx, rec.Job.ID, job.Change{Status: job.StatusWaiting, State: &st, Tenant: rec.Job.Tenant,
		Event: &job.Event{Type: job.EventWaiting, RetryAfterSeconds: secs}})
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		log.Warn("dispatch: mark waiting", "err", err)
	}
	rec.State = st
	return sleep(ctx, after), nil
}

// wait re-enqueues a request until capacity returns, or fails it when that
// is past its deadline.
func (d *Dispatcher) wait(ctx context.Context, rec *job.Record, after time.Duration, log *slog.Logger) error {
	after = max(after, d.cfg.MinWait)
	// asynq stores a retry time in whole Unix seconds and runs the task once
	// that second begins: up to 1 s before capacity returns. Woken early, the
	// request would find every route still shut, count another failure on
	// the "all" breaker (three such wake-ups within one cooldown open it) and
	// wait again. So wake at the first whole second after capacity returns.
	retryAt := time.Now().Add(after).Truncate(time.Second).Add(time.Second)
	after = time.Until(retryAt)
	if retryAt.After(rec.Job.Deadline) {
		return d.fail(ctx, rec, job.CodeDeadline,
			deadlineReason(rec, fmt.Sprintf("and every provider route stays exhausted for another %s", after.Round(time.Second))), log)
	}
	st := rec.State
	st.RetryAt = retryAt
	secs := int((after + time.Second - 1) / time.Second)
	_, err := d.jobs.Apply(ctx, rec.Job.ID, job.Change{Status: job.StatusWaiting, State: &st, Tenant: rec.Job.Tenant,
		Event: &job.Event{Type: job.EventWaiting, RetryAfterSeconds: secs}})
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("dispatch: mark waiting: %w", err)
	}
	log.Info("dispatch: all routes exhausted; re-enqueued", "retry_after", after)
	return &waitError{Delay: after}
}

func (d *Dispatcher) retryTransient(ctx context.Context, rec *job.Record, t *asynq.Task, cause error, log *slog.Logger) error {
	n, _ := asynq.GetRetryCount(ctx)
	maxRetry, _ := asynq.GetMaxRetry(ctx)
	delay := min(backoff(n+1), d.cfg.MaxTransientWait)
	if n >= maxRetry || time.Now().Add(delay).After(rec.Job.Deadline) {
		return d.fail(ctx, rec, job.CodeProviderUnavailable,
			fmt.Sprintf("provider_unavailable: %d attempts failed; last error: %v", rec.State.Attempts, cause), log)
	}
	st := rec.State
	st.RetryAt = time.Now().Add(delay)
	// The caller is told the class of failure, never the error itself: it
	// may quote a provider's answer or an address (the call's own failures
	// are logged in failed).
	_, _ = d.jobs.Apply(ctx, rec.Job.ID, job.Change{Status: job.StatusWaiting, State: &st, Tenant: rec.Job.Tenant,
		Event: &job.Event{Type: job.EventRetrying, Error: consequenceOf(cause).event, RetryAfterSeconds: int(delay.Seconds()) + 1}})
	return &transientError{Delay: delay, Err: cause}
}

// fail ends rec as failed. reason is the detail for operators (it may
// quote the provider): the finisher logs it redacted and shows the tenant
// only the fixed text of code. It returns the handler's result: nil once
// the request ended (by this call or another), an error asynq retries when
// the terminal write failed.
func (d *Dispatcher) fail(ctx context.Context, rec *job.Record, code job.Code, reason string, _ *slog.Logger) error {
	err := d.finisher.Finish(ctx, rec, finish.Failed(rec.State, code, reason))
	switch {
	case errors.Is(err, finish.ErrEnded):
		return nil
	case err != nil:
		return fmt.Errorf("dispatch: %w", err)
	}
	return nil
}

// completeTries and completeBackoff bound how long a worker keeps trying
// to record an answer it holds: 10 tries, 1 s apart.
const (
	completeTries   = 10
	completeBackoff = time.Second
)

// complete ends rec as completed with its answer (the finisher caches it
// once the caller has it).
func (d *Dispatcher) complete(ctx context.Context, rec *job.Record, out outcome, log *slog.Logger) error {
	st := rec.State
	st.ServedRoute = &out.route
	st.KeyID = out.keyID
	st.Result = out.resp
	st.Cached = job.CachedNone
	st.TokensSaved = out.saved
	st.MaxTokensClamped = out.clamped
	rec.State = st
	// The answer is paid for: keep trying to record it for a while (Redis
	// restarting answers LOADING for seconds) before handing the task back
	// to asynq, whose retry would call the provider again unless the
	// answer was cached.
	var err error
	for try := 0; try < completeTries; try++ {
		if err = d.finisher.Finish(ctx, rec, finish.Completed(st)); err == nil || errors.Is(err, finish.ErrEnded) {
			break
		}
		log.Warn("dispatch: record the answer", "try", try+1, "err", err)
		if !sleep(context.WithoutCancel(ctx), completeBackoff) {
			break
		}
	}
	switch {
	case errors.Is(err, finish.ErrEnded):
		return nil
	case err != nil:
		return fmt.Errorf("dispatch: %w", err)
	}
	log.Info("dispatch: completed", "route", out.route.String(), "key_id", out.keyID, "attempts", st.Attempts)
	return nil
}
