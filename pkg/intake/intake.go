// Package intake accepts requests: it validates them, resolves the tenant's
// priority, answers from the semantic cache (layer 1), attaches identical
// requests already in flight to the first one (coalescing), applies
// admission control (layer 2), stores the live record and enqueues it. The
// async API and the OpenAI/Anthropic-compatible endpoints share it, so
// every entry point gets the same five layers.
package intake

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
)

// Tenant is an authenticated client.
type Tenant struct {
	Name            string
	DefaultPriority priority.Priority
	MaxPriority     priority.Priority
	RateLimitRPM    int // <= 0: unlimited
	// MaxQueued bounds its requests not ended yet; <= 0: unlimited.
	MaxQueued int
	// MaxStreams and MaxSyncWaits bound its open event streams and waiting
	// compat requests per API process (enforced by pkg/httpapi); <= 0:
	// unlimited.
	MaxStreams, MaxSyncWaits int
	// MaxReadsPerSecond bounds its reads (GET of a request, a model, an
	// event stream opened) per API process (pkg/httpapi); <= 0: unlimited.
	MaxReadsPerSecond int
	DefaultLayer      string
}

// Submission is a request as the caller asked for it.
type Submission struct {
	Route    llm.Route
	Request  llm.Request
	Priority priority.Priority // 0 = tenant default
	CaseID   string
	Layer    string
	// ToolResultsHash scopes the cache; computed from tool results when empty.
	ToolResultsHash string
	Metadata        map[string]string
	NoCacheRead     bool
	NoCacheWrite    bool
	NoCompress      bool // the caller opts out of prompt compression
	IdempotencyKey  string
	Lang            string // "zh" or "en", for messages
	// Waited says the caller waits for the answer (the compat endpoints)
	// and shows neither a queue position nor a degraded notice: intake
	// skips reading them (the queue's depth and drain rate, the breakers),
	// several Redis round trips per request that nobody would read.
	Waited bool
	// Stream asks for the answer's deltas as the provider writes them
	// (job.Job.Stream): a streaming compat call, stream on the async API.
	Stream bool
	// ModelMaxTokens gives a request without max_tokens its route's limit
	// (Config.OutputLimit) instead of Config.DefaultMaxTokens: OpenAI's
	// Chat Completions, where none means the model's maximum.
	ModelMaxTokens bool
}

// answeredInResponse reports whether the caller takes the answer in its
// response and has no Idempotency-Key to ask for it again (a compat call):
// once ended, only GET by id, which history answers, looks for it.
func (s Submission) answeredInResponse() bool { return s.Waited && s.IdempotencyKey == "" }

// Accepted is the answer to a submission.
type Accepted struct {
	ID       string
	Status   job.Status
	Priority priority.Priority
	Position int
	ETA      time.Duration
	Message  string
	// Degraded is set while the breakers say every route is exhausted; the
	// request is queued all the same and finishes after recovery.
	Degraded   bool
	RetryAfter time.Duration
	// Cached answers (exact, semantic, coalesced with a leader that had
	// just completed) complete at once.
	Cached     job.Cached
	Similarity float64
	CacheAge   time.Duration
	Result     *job.Result
	// Existing is true when an Idempotency-Key matched an earlier request,
	// or a compat call joined the one it repeats (job.Job.JoinKey): ID is
	// that request's.
	Existing bool
	// CoalescedInto names the identical request in flight this one joined.
	CoalescedInto string
	// JoinKey is set when request ID holds a join key (a compat call
	// without an Idempotency-Key, stored or joined; job.Job.JoinKey): the
	// caller unjoins it once it has delivered the answer, so that a resend
	// after that is a call of its own.
	JoinKey string
	// Ended is the terminal record of a submission that ended at once (a
	// cache hit, or the answer of a leader that had just completed), so a
	// caller waiting for the answer need not read it back.
	Ended *job.Record
}

// Queue is the part of queue.Queue intake uses.
type Queue interface {
	Admit(ctx context.Context) error
	Enqueue(ctx context.Context, id string, p priority.Priority, delay time.Duration) error
	SpotOf(ctx context.Context, id string) (queue.Spot, error)
	Cancel(ctx context.Context, id string, p priority.Priority) (bool, error)
	Rate(ctx context.Context) (float64, error)
}

// Promoter makes a request run at a more urgent priority than it asked
// for: one that a more urgent identical request now waits on.
type Promoter interface {
	Promote(ctx context.Context, rec *job.Record, p priority.Priority) error
}

// ErrUnconfirmed is what Jobs.Create returns, with the id and created
// true, for a request it stored but could not confirm durable in time
// (redis.min_replicas_acked). Submit takes it on as usual — queued and run,
// a failover being unlikely — and then returns the error, so the caller
// is told to resend (503): a resend with the same Idempotency-Key finds
// it, confirms it again and gets its status.
var ErrUnconfirmed = errors.New("intake: request stored but not confirmed durable")

// UnconfirmedError is what Submit returns for such a request: it names the
// request, so that a caller without an Idempotency-Key can still follow
// it (GET /v1/requests/{id}). It wraps ErrUnconfirmed.
type UnconfirmedError struct {
	ID  string
	Err error
}

func (e *UnconfirmedError) Error() string { return fmt.Sprintf("request %s: %v", e.ID, e.Err) }
func (e *UnconfirmedError) Unwrap() error { return e.Err }

// Jobs is the live request store.
type Jobs interface {
	// Create stores j unless the tenant has maxLive requests not ended
	// (job.ErrTenantFull); maxLive <= 0 sets no limit. An error wrapping
	// ErrUnconfirmed comes with the id of a request that was stored.
	Create(ctx context.Context, j *job.Job, ev job.Event, idemKey string, maxLive int) (string, bool, error)
	// Idempotent returns the request tenant submitted with idemKey, or "".
	Idempotent(ctx context.Context, tenant, idemKey string) (string, error)
	// Joinable returns the request whose Job.JoinKey is key, or "".
	Joinable(ctx context.Context, key string) (string, error)
	// Unjoin ends request id's hold on join key key.
	Unjoin(ctx context.Context, key, id string) error
	Apply(ctx context.Context, id string, c job.Change) (string, error)
	Get(ctx context.Context, id string) (*job.Record, error)
}

// BreakerStatus reads breaker states.
type BreakerStatus interface {
	Status(ctx context.Context, name string) (breaker.Status, error)
}

// History records submissions, and the end of requests the API ends
// itself (cancellations).
type History interface {
	Submitted(ctx context.Context, j *job.Job, status job.Status, cached job.Cached)
	Finished(ctx context.Context, rec *job.Record, costUSD float64)
}

// Cache is layer 1 as intake sees it (pkg/cache).
type Cache interface {
	// Ref names a request's identity, for coalescing and the exact entry.
	Ref(j *job.Job) string
	// AnswerFor looks up j's answer, exactly then by similarity.
	AnswerFor(ctx context.Context, j *job.Job) (cache.Found, error)
	// ExactAnswerFor finds only the entry of an identical request.
	ExactAnswerFor(ctx context.Context, j *job.Job) (cache.Found, error)
}

// Finisher ends requests (pkg/finish).
type Finisher interface {
	Finish(ctx context.Context, rec *job.Record, e finish.Ending) error
	FinishNew(ctx context.Context, j *job.Job, idemKey string, e finish.Ending) (rec *job.Record, otherID string, created bool, err error)
	EndUnstored(ctx context.Context, j *job.Job, e finish.Ending) (*job.Record, error)
}

// Coalescer attaches identical in-flight requests to the first one.
type Coalescer interface {
	// Claim makes id the leader of key, or returns the current leader.
	Claim(ctx context.Context, key, id string, ttl time.Duration) (leader string, err error)
	// Release ends id's claim of key (a no-op when another holds it).
	Release(ctx context.Context, key, id string) error
}

// RateLimiter bounds a tenant's submissions.
type RateLimiter interface {
	Allow(ctx context.Context, tenant string, perMinute int) (ok bool, retryAfter time.Duration, err error)
}

// Intake is safe for concurrent use.
type Intake struct {
	cfg       Config
	jobs      Jobs
	finisher  Finisher
	queue     Queue
	breakers  BreakerStatus
	history   History
	cache     Cache
	coalescer Coalescer
	promoter  Promoter
	limiter   RateLimiter
	metrics   *metrics.Metrics
	logger    *slog.Logger
}

// Deps are the collaborators; History, Cache, Coalescer and RateLimiter may be nil.
type Deps struct {
	Jobs        Jobs
	Finisher    Finisher
	Queue       Queue
	Breakers    BreakerStatus
	History     History
	Cache       Cache
	Coalescer   Coalescer
	Promoter    Promoter // optional: without it a shared call keeps its leader's priority
	RateLimiter RateLimiter
	Metrics     *metrics.Metrics
	Logger      *slog.Logger
}

// New returns an Intake.
func New(cfg Config, d Deps) *Intake {
	cfg = cfg.WithDefaults()
	if d.Metrics == nil {
		d.Metrics = metrics.New(nil)
	}
	return &Intake{cfg: cfg, jobs: d.Jobs, finisher: d.Finisher, queue: d.Queue, breakers: d.Breakers, history: d.History,
		cache: d.Cache, coalescer: d.Coalescer, promoter: d.Promoter, limiter: d.RateLimiter, metrics: d.Metrics, logger: d.Logger}
}

// Errors callers branch on (HTTP status in brackets).
var (
	ErrRateLimited = errors.New("intake: tenant rate limit exceeded") // [429]
)

// RateLimitError carries the tenant's Retry-After.
type RateLimitError struct{ RetryAfter time.Duration }

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("tenant rate limit exceeded; retry after %s", e.RetryAfter)
}
func (e *RateLimitError) Is(t error) bool { return t == ErrRateLimited }

// TenantFullError says a tenant has its share of the queue in flight.
type TenantFullError struct {
	Limit      int
	RetryAfter time.Duration
}

func (e *TenantFullError) Error() string {
	return fmt.Sprintf("this tenant already has %d requests in flight, its share of the queue; retry after %d seconds",
		e.Limit, int((e.RetryAfter+time.Second-1)/time.Second))
}

// tenantFull turns job.ErrTenantFull into a TenantFullError whose
// Retry-After is the time for a tenth of the share to drain.
func (in *Intake) tenantFull(ctx context.Context, t Tenant) error {
	after := time.Second
	if rate, err := in.queue.Rate(ctx); err == nil && rate > 0 {
		after = max(after, time.Duration(float64(max(1, t.MaxQueued/10))/rate*float64(time.Second)))
	}
	return &TenantFullError{Limit: t.MaxQueued, RetryAfter: after}
}

// Submit accepts a submission for tenant t.
func (in *Intake) Submit(ctx context.Context, t Tenant, s Submission) (*Accepted, error) {
	j, err := in.build(t, s)
	if err != nil {
		return nil, err
	}
	// A retry of a request already accepted gets that request back first:
	// neither the rate limit nor a full queue may turn it into a 429. A
	// compat call without a key is found by what it asks, until the
	// answer of the call it repeats has reached a caller (join.go).
	if s.IdempotencyKey != "" {
		id, err := in.jobs.Idempotent(ctx, t.Name, s.IdempotencyKey)
		if err != nil {
			return nil, err
		}
		if id != "" {
			return in.existing(ctx, id, s)
		}
	}
	if j.JoinKey != "" {
		id, err := in.jobs.Joinable(ctx, j.JoinKey)
		if err != nil {
			return nil, err
		}
		if id != "" {
			if a, ok, err := in.join(ctx, j, id, s); ok || err != nil {
				return a, err
			}
		}
	}
	if in.limiter != nil && t.RateLimitRPM > 0 {
		ok, after, err := in.limiter.Allow(ctx, t.Name, t.RateLimitRPM)
		if err != nil {
			return nil, fmt.Errorf("intake: tenant rate limit: %w", err)
		}
		if !ok {
			in.metrics.AdmissionRejected.WithLabelValues(j.Priority.String(), metrics.ReasonRateLimited).Inc()
			return nil, &RateLimitError{RetryAfter: after}
		}
	}
	in.metrics.RequestsSubmitted.WithLabelValues(j.Priority.String()).Inc()

	if a, ok := in.fromCache(ctx, j, s); ok {
		return a, nil
	}
	if err := in.queue.Admit(ctx); err != nil {
		if errors.Is(err, queue.ErrQueueFull) {
			in.metrics.AdmissionRejected.WithLabelValues(j.Priority.String(), metrics.ReasonQueueFull).Inc()
		}
		return nil, err
	}
	// The record exists before the coalescing claim, so whoever finds this
	// request leading can always read it.
	id, created, err := in.jobs.Create(ctx, j, job.Event{Type: job.EventQueued}, s.IdempotencyKey, t.MaxQueued)
	if errors.Is(err, ErrUnconfirmed) && created {
		// Stored: it goes on, and the caller is told to resend. Nobody
		// sees its place, so none is read (as for a waiting caller).
		quiet := s
		quiet.Waited = true
		if _, qerr := in.stored(ctx, j, quiet); qerr != nil {
			return nil, qerr
		}
		return nil, &UnconfirmedError{ID: id, Err: err}
	}
	if errors.Is(err, job.ErrTenantFull) {
		in.metrics.AdmissionRejected.WithLabelValues(j.Priority.String(), metrics.ReasonTenantFull).Inc()
		return nil, in.tenantFull(ctx, t)
	}
	if errors.Is(err, job.ErrOverBudget) {
		in.metrics.AdmissionRejected.WithLabelValues(j.Priority.String(), metrics.ReasonOverBudget).Inc()
		return nil, err
	}
	if err != nil {
		return nil, err
	}
	if !created && j.JoinKey != "" { // its join key named another request
		if a, ok, err := in.join(ctx, j, id, s); ok || err != nil {
			return a, err
		}
		return nil, fmt.Errorf("intake: the request %s a resend joined is gone; send it again", id)
	}
	if !created {
		return in.existing(ctx, id, s)
	}
	a, err := in.stored(ctx, j, s)
	if a != nil {
		a.JoinKey = j.JoinKey // held in Redis until the answer is delivered
	}
	return a, err
}

// join answers a resent compat call with the request id its join key
// names (join.go). A key whose record is gone (lost in a failover) holds
// nothing: it is dropped and ok is false, so the call is taken as new.
func (in *Intake) join(ctx context.Context, j *job.Job, id string, s Submission) (*Accepted, bool, error) {
	a, err := in.existing(ctx, id, s)
	if errors.Is(err, job.ErrNotFound) {
		if err := in.jobs.Unjoin(ctx, j.JoinKey, id); err != nil {
			return nil, false, err
		}
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	in.logger.Debug("intake: a resent compat call joins the request it repeats", "request_id", id)
	a.JoinKey = j.JoinKey
	return a, true, nil
}

// stored takes a request just stored to its queue, or to the identical
// request it joins, or to the answer that came meanwhile.
func (in *Intake) stored(ctx context.Context, j *job.Job, s Submission) (*Accepted, error) {
	if a, ok, err := in.coalesce(ctx, j, s); err != nil || ok {
		return a, err
	}
	if a, ok := in.answeredMeanwhile(ctx, j); ok {
		return a, nil
	}
	if in.cfg.AfterStore != nil {
		if err := in.cfg.AfterStore(j.ID); err != nil {
			return nil, err
		}
	}
	return in.enqueue(ctx, j, s)
}

// enqueue puts a stored job on its queue.
func (in *Intake) enqueue(ctx context.Context, j *job.Job, s Submission) (*Accepted, error) {
	id := j.ID
	if err := in.queue.Enqueue(ctx, id, j.Priority, 0); err != nil {
		// Stored, but its task is not: the queue's Redis failed where the
		// record's did not (a cluster master down, a blip). The orphan
		// sweep queues a live record with no task once it is a few seconds
		// old, so the request stands accepted and runs late; ending it here
		// would fail a request for a moment's outage. (Its deadline still
		// holds should the queue stay down.)
		in.logger.Warn("intake: enqueue failed; the orphan sweep will queue the request", "request_id", id, "err", err)
	}
	if in.history != nil {
		in.history.Submitted(ctx, j, job.StatusQueued, job.CachedNone)
	}
	a := &Accepted{ID: id, Status: job.StatusQueued, Priority: j.Priority}
	if !s.Waited {
		in.position(ctx, a, s.Lang)
		in.degraded(ctx, j, a, s.Lang)
	}
	return a, nil
}

func (in *Intake) position(ctx context.Context, a *Accepted, lang string) {
	sp, err := in.queue.SpotOf(ctx, a.ID)
	if err != nil {
		in.logger.Warn("intake: queue position", "request_id", a.ID, "err", err)
		return
	}
	if sp.Position == 0 {
		sp.Position = 1 // started
	}
	a.Position, a.ETA = sp.Position, sp.ETA
	a.Message = progress.QueuedMessage(lang, sp.Position, progress.WaitSeconds(sp.ETA))
}

// routeOrder is the routes j tries; without RouteOrder, its own only.
func (in *Intake) routeOrder(j *job.Job) []llm.Route {
	if in.cfg.RouteOrder == nil {
		return []llm.Route{j.Route}
	}
	return in.cfg.RouteOrder(j.Route, j.Layer)
}

// degraded marks the answer service_degraded when the "all" breaker, or the
// breakers of every route the request may take, are not closed.
func (in *Intake) degraded(ctx context.Context, j *job.Job, a *Accepted, lang string) {
	if in.breakers == nil {
		return
	}
	st, err := in.breakers.Status(ctx, breaker.AllName)
	if err == nil && st.State != breaker.StateClosed {
		in.markDegraded(a, st, lang)
		return
	}
	var names []string
	for _, r := range in.routeOrder(j) {
		names = append(names, r.String())
	}
	var soonest breaker.Status
	for i, n := range names {
		st, err := in.breakers.Status(ctx, n)
		if err != nil || st.State == breaker.StateClosed {
			return
		}
		if i == 0 || st.RetryAt.Before(soonest.RetryAt) {
			soonest = st
		}
	}
	in.markDegraded(a, soonest, lang)
}

func (in *Intake) markDegraded(a *Accepted, st breaker.Status, lang string) {
	a.Degraded = true
	a.RetryAfter = max(time.Until(st.RetryAt), time.Second)
	a.Message = progress.DegradedMessage(lang)
}

// existing answers a submission that names an earlier request (its
// idempotency key), with that request's place unless the caller waits
// for the answer.
func (in *Intake) existing(ctx context.Context, id string, s Submission) (*Accepted, error) {
	rec, err := in.jobs.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	a := &Accepted{ID: id, Status: rec.Status, Priority: rec.Job.Priority, Existing: true, Result: job.ResultOf(rec.State)}
	if leader := rec.State.CoalescedInto; leader != "" && !rec.Status.Terminal() {
		// A follower waits behind its leader: its place is the leader's,
		// and a compat retry must wait on the leader's answer.
		a.CoalescedInto = leader
		if lrec, err := in.jobs.Get(ctx, leader); err == nil {
			a.Status = lrec.Status
			if lrec.Status == job.StatusQueued && !s.Waited {
				in.leaderSpot(ctx, a, leader, s.Lang)
			}
		}
		return a, nil
	}
	if rec.Status == job.StatusQueued && !s.Waited {
		in.position(ctx, a, s.Lang)
	}
	return a, nil
}

// leaderSpot gives a follower the queue place of its queued leader (1 when
// a worker has just taken it).
func (in *Intake) leaderSpot(ctx context.Context, a *Accepted, leader, lang string) {
	sp, _ := in.queue.SpotOf(ctx, leader)
	a.Position, a.ETA = max(sp.Position, 1), sp.ETA
	a.Message = progress.QueuedMessage(lang, a.Position, progress.WaitSeconds(a.ETA))
}

// Cancel ends rec as cancelled by its caller and takes its task off the
// queue (or stops the worker running it). A coalesced follower only
// detaches: the request it joined goes on. It returns finish.ErrEnded when
// the request had already ended.
func (in *Intake) Cancel(ctx context.Context, rec *job.Record) error {
	st := rec.State
	st.Result = nil
	if err := in.finisher.Finish(ctx, rec, finish.Cancelled(st, "cancelled by the caller")); err != nil {
		return err
	}
	if rec.State.CoalescedInto != "" {
		return nil
	}
	if _, err := in.queue.Cancel(context.WithoutCancel(ctx), rec.Job.ID, rec.Job.Priority); err != nil {
		// The request has ended: a worker that still takes its task finds
		// it terminal and drops it.
		in.logger.Warn("intake: cancel: remove the task", "request_id", rec.Job.ID, "err", err)
	}
	return nil
}
