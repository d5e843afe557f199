package intake_test

// Small hand-written fakes of the interfaces pkg/intake declares, for its
// unit tests: each keeps what it was asked under a mutex, and is set up by
// plain fields before the test submits. Intake calls them synchronously,
// so a test reads them as soon as Submit or Cancel returns.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/finish"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/queue"
)

var (
	sonnet = llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	haiku  = llm.Route{Provider: llm.ProviderClaude, Tier: "haiku"}
	gpt4o  = llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
	demo   = intake.Tenant{Name: "demo", DefaultPriority: priority.Normal}
)

// ask is a one-question submission on sonnet.
func ask(text string) intake.Submission {
	return intake.Submission{Route: sonnet, Lang: "en", Request: llm.Request{Messages: []llm.Message{
		{Role: llm.RoleUser, Content: []llm.Block{{Type: llm.BlockText, Text: text}}}}}}
}

// answer is a provider's answer saying text.
func answer(text string) *llm.Response {
	return &llm.Response{Model: "m", Content: []llm.Block{{Type: llm.BlockText, Text: text}}, StopReason: llm.StopEndTurn}
}

// fakeJobs is the live store in memory.
type fakeJobs struct {
	mu      sync.Mutex
	recs    map[string]*job.Record
	idem    map[string]string // tenant + "/" + key → id
	joins   map[string]string // join key → id
	applied map[string][]job.Change
	maxLive []int // the limit each Create was given
	// hideIdem makes Idempotent miss, as when a retry races the first
	// request: Create then finds the key.
	hideIdem bool
	getErr   error
}

func newFakeJobs() *fakeJobs {
	return &fakeJobs{recs: map[string]*job.Record{}, idem: map[string]string{}, joins: map[string]string{},
		applied: map[string][]job.Change{}}
}

func (f *fakeJobs) Create(_ context.Context, j *job.Job, _ job.Event, idemKey string, maxLive int) (string, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.maxLive = append(f.maxLive, maxLive)
	if id, ok := f.idem[j.Tenant+"/"+idemKey]; idemKey != "" && ok {
		return id, false, nil
	}
	if id := f.joinable(j.JoinKey); id != "" {
		return id, false, nil
	}
	if maxLive > 0 {
		live := 0
		for _, r := range f.recs {
			if r.Job.Tenant == j.Tenant && !r.Status.Terminal() {
				live++
			}
		}
		if live >= maxLive {
			return "", false, job.ErrTenantFull
		}
	}
	f.recs[j.ID] = &job.Record{Job: *j, Status: job.StatusQueued}
	if j.JoinKey != "" {
		f.joins[j.JoinKey] = j.ID
	}
	if idemKey != "" {
		f.idem[j.Tenant+"/"+idemKey] = j.ID
	}
	return j.ID, true, nil
}

// Joinable returns the request join key key names, as the store does.
func (f *fakeJobs) Joinable(_ context.Context, key string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.joinable(key), nil
}

func (f *fakeJobs) joinable(key string) string {
	if key == "" {
		return ""
	}
	return f.joins[key]
}

func (f *fakeJobs) Unjoin(_ context.Context, key, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.joins[key] == id {
		delete(f.joins, key)
	}
	return nil
}

func (f *fakeJobs) Idempotent(_ context.Context, tenant, idemKey string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hideIdem {
		return "", nil
	}
	return f.idem[tenant+"/"+idemKey], nil
}

func (f *fakeJobs) Apply(_ context.Context, id string, c job.Change) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied[id] = append(f.applied[id], c)
	return "1-1", f.apply(id, c)
}

// apply changes a record as the store's script would (f.mu held).
func (f *fakeJobs) apply(id string, c job.Change) error {
	r, ok := f.recs[id]
	if !ok {
		return job.ErrNotFound
	}
	if r.Status.Terminal() {
		return job.ErrTerminal
	}
	if c.Status != "" {
		r.Status, r.Code, r.Reason = c.Status, c.Code, c.Reason
	}
	if c.State != nil {
		r.State = *c.State
	}
	return nil
}

func (f *fakeJobs) Get(_ context.Context, id string) (*job.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return nil, f.getErr
	}
	r, ok := f.recs[id]
	if !ok {
		return nil, job.ErrNotFound
	}
	cp := *r
	return &cp, nil
}

// put stores rec as it is.
func (f *fakeJobs) put(rec job.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs[rec.Job.ID] = &rec
}

func (f *fakeJobs) record(t *testing.T, id string) job.Record {
	t.Helper()
	r, err := f.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("record %s: %v", id, err)
	}
	return *r
}

func (f *fakeJobs) changes(id string) []job.Change {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applied[id])
}

func (f *fakeJobs) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.recs)
}

// fakeFinisher ends records in fakeJobs, as pkg/finish does in Redis.
type fakeFinisher struct {
	jobs     *fakeJobs
	mu       sync.Mutex
	calls    []ended
	unstored int // endings EndUnstored wrote without a record
}

type ended struct {
	id string
	e  finish.Ending
}

func (f *fakeFinisher) Finish(_ context.Context, rec *job.Record, e finish.Ending) error {
	f.mu.Lock()
	f.calls = append(f.calls, ended{rec.Job.ID, e})
	f.mu.Unlock()
	f.jobs.mu.Lock()
	err := f.jobs.apply(rec.Job.ID, job.Change{Status: e.Status, State: &e.State, Code: e.Code})
	f.jobs.mu.Unlock()
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return fmt.Errorf("finish %s: %w", rec.Job.ID, finish.ErrEnded)
	}
	rec.Status, rec.State, rec.Code = e.Status, e.State, e.Code
	return err
}

// FinishNew stores j (fakeJobs.Create, no tenant limit) and ends it, as
// the store's one script does.
func (f *fakeFinisher) FinishNew(ctx context.Context, j *job.Job, idemKey string, e finish.Ending) (*job.Record, string, bool, error) {
	id, created, err := f.jobs.Create(ctx, j, job.Event{Type: job.EventQueued}, idemKey, 0)
	if err != nil || !created {
		return nil, id, false, err
	}
	rec := &job.Record{Job: *j, Status: job.StatusQueued}
	if err := f.Finish(ctx, rec, e); err != nil {
		return nil, "", false, err
	}
	return rec, "", true, nil
}

// EndUnstored ends j with no record, as finish.Finisher does for a
// compat call's cache hit.
func (f *fakeFinisher) EndUnstored(_ context.Context, j *job.Job, e finish.Ending) (*job.Record, error) {
	f.mu.Lock()
	f.calls = append(f.calls, ended{j.ID, e})
	f.unstored++
	f.mu.Unlock()
	return &job.Record{Job: *j, Status: e.Status, State: e.State, Code: e.Code}, nil
}

func (f *fakeFinisher) endings() []ended {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// fakeQueue records what was enqueued and cancelled.
type fakeQueue struct {
	mu         sync.Mutex
	admitErr   error
	enqueueErr error
	spot       queue.Spot // every request's
	rate       float64
	enqueued   []task
	cancelled  []task
}

type task struct {
	id string
	p  priority.Priority
}

func (q *fakeQueue) Admit(context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.admitErr
}

func (q *fakeQueue) Enqueue(_ context.Context, id string, p priority.Priority, _ time.Duration) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.enqueueErr != nil {
		return q.enqueueErr
	}
	q.enqueued = append(q.enqueued, task{id, p})
	return nil
}

func (q *fakeQueue) SpotOf(context.Context, string) (queue.Spot, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.spot, nil
}

func (q *fakeQueue) Cancel(_ context.Context, id string, p priority.Priority) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cancelled = append(q.cancelled, task{id, p})
	return true, nil
}

func (q *fakeQueue) Rate(context.Context) (float64, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.rate, nil
}

func (q *fakeQueue) tasks() (enqueued, cancelled []task) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.enqueued), slices.Clone(q.cancelled)
}

// fakeBreakers reports the states set in it; unnamed breakers are closed.
type fakeBreakers struct {
	mu    sync.Mutex
	state map[string]breaker.Status
}

func (b *fakeBreakers) open(name string, retryIn time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.state[name] = breaker.Status{Name: name, State: breaker.StateOpen, RetryAt: time.Now().Add(retryIn)}
}

func (b *fakeBreakers) Status(_ context.Context, name string) (breaker.Status, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if st, ok := b.state[name]; ok {
		return st, nil
	}
	return breaker.Status{Name: name, State: breaker.StateClosed}, nil
}

// fakeHistory records the submissions written.
type fakeHistory struct {
	mu        sync.Mutex
	submitted []string // "id status cached"
}

func (h *fakeHistory) Submitted(_ context.Context, j *job.Job, st job.Status, c job.Cached) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.submitted = append(h.submitted, fmt.Sprintf("%s %s %s", j.ID, st, c))
}

func (h *fakeHistory) Finished(context.Context, *job.Record, float64) {}

func (h *fakeHistory) rows() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.submitted)
}

// fakeCache answers every lookup with what is set in it (a miss by
// default). Its Ref is the tenant, route and last question.
type fakeCache struct {
	mu                  sync.Mutex
	found, exact        cache.Found
	err, exactErr       error
	lookups, exactReads int
}

func (c *fakeCache) Ref(j *job.Job) string {
	return j.Tenant + "|" + j.Route.String() + "|" + j.Request.Messages[len(j.Request.Messages)-1].Text()
}

func (c *fakeCache) AnswerFor(context.Context, *job.Job) (cache.Found, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lookups++
	return c.found, c.err
}

func (c *fakeCache) ExactAnswerFor(context.Context, *job.Job) (cache.Found, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exactReads++
	return c.exact, c.exactErr
}

func (c *fakeCache) reads() (lookups, exact int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lookups, c.exactReads
}

// fakeCoalescer holds claims in a map.
type fakeCoalescer struct {
	mu       sync.Mutex
	leaders  map[string]string
	released []string // "key id"
}

func (c *fakeCoalescer) Claim(_ context.Context, key, id string, _ time.Duration) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.leaders[key]; ok {
		return l, nil
	}
	c.leaders[key] = id
	return id, nil
}

func (c *fakeCoalescer) Release(_ context.Context, key, id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.released = append(c.released, key+" "+id)
	if c.leaders[key] == id {
		delete(c.leaders, key)
	}
	return nil
}

func (c *fakeCoalescer) releases() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.released)
}

// fakePromoter records promotions as "id priority".
type fakePromoter struct {
	mu       sync.Mutex
	promoted []string
}

func (p *fakePromoter) Promote(_ context.Context, rec *job.Record, to priority.Priority) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.promoted = append(p.promoted, rec.Job.ID+" "+to.String())
	return nil
}

func (p *fakePromoter) calls() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.promoted)
}

// fakeLimiter allows until deny is set.
type fakeLimiter struct {
	mu    sync.Mutex
	deny  bool
	after time.Duration
	asked []string // "tenant rpm"
}

func (l *fakeLimiter) Allow(_ context.Context, tenant string, perMinute int) (bool, time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.asked = append(l.asked, fmt.Sprintf("%s %d", tenant, perMinute))
	if l.deny {
		return false, l.after, nil
	}
	return true, 0, nil
}

func (l *fakeLimiter) calls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.asked)
}

// rig is an Intake on fakes.
type rig struct {
	in       *intake.Intake
	jobs     *fakeJobs
	finisher *fakeFinisher
	queue    *fakeQueue
	breakers *fakeBreakers
	history  *fakeHistory
	cache    *fakeCache
	claims   *fakeCoalescer
	promoter *fakePromoter
	limiter  *fakeLimiter
	metrics  *metrics.Metrics
}

// newRig builds an Intake on fresh fakes; edit changes its config (and may
// be nil).
func newRig(edit func(*intake.Config)) *rig {
	jobs := newFakeJobs()
	r := &rig{jobs: jobs, finisher: &fakeFinisher{jobs: jobs},
		queue:    &fakeQueue{spot: queue.Spot{Position: 3, ETA: 4500 * time.Millisecond}},
		breakers: &fakeBreakers{state: map[string]breaker.Status{}}, history: &fakeHistory{}, cache: &fakeCache{},
		claims: &fakeCoalescer{leaders: map[string]string{}}, promoter: &fakePromoter{}, limiter: &fakeLimiter{},
		metrics: metrics.New(nil)}
	cfg := intake.Config{
		Routes: map[llm.Route]bool{sonnet: true, haiku: true, gpt4o: true},
		RouteOrder: func(r llm.Route, _ string) []llm.Route {
			if r == sonnet {
				return []llm.Route{sonnet, gpt4o}
			}
			return []llm.Route{r}
		},
		MaxWait: time.Minute, MaxPromptChars: 10_000, MaxTokensLimit: 4096, DefaultMaxTokens: 1024,
		Layers: map[string]bool{"agent": true, "router": true}, DefaultLayer: "agent", CacheEnabled: true,
	}
	if edit != nil {
		edit(&cfg)
	}
	r.in = intake.New(cfg, intake.Deps{Jobs: jobs, Finisher: r.finisher, Queue: r.queue, Breakers: r.breakers,
		History: r.history, Cache: r.cache, Coalescer: r.claims, Promoter: r.promoter, RateLimiter: r.limiter,
		Metrics: r.metrics, Logger: slog.New(slog.DiscardHandler)})
	return r
}

// submit submits s for t and fails the test on an error.
func (r *rig) submit(t *testing.T, tn intake.Tenant, s intake.Submission) *intake.Accepted {
	t.Helper()
	a, err := r.in.Submit(context.Background(), tn, s)
	if err != nil {
		t.Fatalf("Submit: %v", err)
	}
	return a
}

// value reads a counter.
func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
