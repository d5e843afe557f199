package httpapi_test

// A server on small fakes of the interfaces pkg/httpapi and pkg/intake
// declare, with a real *intake.Intake and a real progress.Hub on the
// test's own Redis database: the fake store publishes its events on the
// hub's channel exactly as job.Store does, so what waits on the hub (the
// compat endpoints' await, the event streams) is woken by real pub/sub
// messages. Tests learn what the server did through channels the fakes
// feed (enqueued ids, reads of a record), never by sleeping.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/breaker"
	"bulwark/pkg/cache"
	"bulwark/pkg/finish"
	"bulwark/pkg/history"
	"bulwark/pkg/httpapi"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
	"bulwark/pkg/secret"
	"bulwark/pkg/testkit/testenv"
)

func init() { gin.SetMode(gin.TestMode) }

var sonnet = llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}

// Tokens of the tenants the server knows, and the admin token.
const (
	tokAcme    = "tok-acme"
	tokGlobex  = "tok-globex"
	tokLimited = "tok-limited"
	tokAdmin   = "tok-admin"
)

// memJobs is the live store in memory; every event it stores is published
// on channel as "{id} {stream id} {event JSON}", as job.Store does.
type memJobs struct {
	rdb     *redis.Client
	channel string
	gets    chan string // the id of every Get, when there is room

	mu     sync.Mutex
	recs   map[string]*job.Record
	joins  map[string]string // join key → id
	events map[string][]job.Event
	lastMS int64
	seq    int
}

// nextID returns a stream id after every earlier one (m.mu held).
func (m *memJobs) nextID() string {
	ms := time.Now().UnixMilli()
	if ms > m.lastMS {
		m.lastMS, m.seq = ms, 0
	} else {
		m.seq++
	}
	return fmt.Sprintf("%d-%d", m.lastMS, m.seq)
}

// store appends ev to id's stream and publishes it (m.mu held).
func (m *memJobs) store(id string, ev job.Event) string {
	ev.RequestID = id
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	ev.ID = m.nextID()
	m.events[id] = append(m.events[id], ev)
	js, _ := json.Marshal(ev)
	if err := m.rdb.Publish(context.Background(), m.channel, id+" "+ev.ID+" "+string(js)).Err(); err != nil {
		panic(err) // the test's own Redis is down: nothing below would work
	}
	return ev.ID
}

func (m *memJobs) Create(_ context.Context, j *job.Job, ev job.Event, _ string, maxLive int) (string, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id := m.joinable(j.JoinKey); id != "" {
		return id, false, nil
	}
	if maxLive > 0 {
		live := 0
		for _, r := range m.recs {
			if r.Job.Tenant == j.Tenant && !r.Status.Terminal() {
				live++
			}
		}
		if live >= maxLive {
			return "", false, job.ErrTenantFull
		}
	}
	m.recs[j.ID] = &job.Record{Job: *j, Status: job.StatusQueued}
	if j.JoinKey != "" {
		m.joins[j.JoinKey] = j.ID
	}
	ev.Status = job.StatusQueued
	m.store(j.ID, ev)
	return j.ID, true, nil
}

func (m *memJobs) Idempotent(context.Context, string, string) (string, error) { return "", nil }

// Joinable returns the request join key key names, as the store does.
func (m *memJobs) Joinable(_ context.Context, key string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joinable(key), nil
}

func (m *memJobs) joinable(key string) string {
	if key == "" {
		return ""
	}
	return m.joins[key]
}

func (m *memJobs) Unjoin(_ context.Context, key, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.joins[key] == id {
		delete(m.joins, key)
	}
	return nil
}

func (m *memJobs) Apply(_ context.Context, id string, c job.Change) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return "", job.ErrNotFound
	}
	if r.Status.Terminal() {
		return "", job.ErrTerminal
	}
	if c.Status != "" {
		r.Status = c.Status
	}
	if c.State != nil {
		r.State = *c.State
	}
	if c.Code != "" || c.Reason != "" {
		r.Code, r.Reason = c.Code, c.Reason
	}
	if c.Event == nil {
		return "", nil
	}
	ev := *c.Event
	if ev.Status == "" {
		ev.Status = c.Status
	}
	return m.store(id, ev), nil
}

// forget drops id's record, as a Redis that lost it would.
func (m *memJobs) forget(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, id)
}

func (m *memJobs) StatusOf(ctx context.Context, id string) (job.Status, error) {
	r, err := m.Get(ctx, id)
	if err != nil {
		return "", err
	}
	return r.Status, nil
}

func (m *memJobs) Get(_ context.Context, id string) (*job.Record, error) {
	select {
	case m.gets <- id:
	default:
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return nil, job.ErrNotFound
	}
	cp := *r
	return &cp, nil
}

func (m *memJobs) Events(_ context.Context, id, after string) ([]job.Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []job.Event
	for _, ev := range m.events[id] {
		if after == "" || job.CompareIDs(ev.ID, after) > 0 {
			out = append(out, ev)
		}
	}
	return out, nil
}

// put stores rec without an event.
func (m *memJobs) put(rec job.Record) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.recs[rec.Job.ID] = &rec
}

// complete ends id with an answer saying text, as a worker would.
func (m *memJobs) complete(t *testing.T, id, text string) {
	t.Helper()
	st := job.State{Result: &llm.Response{Model: "claude-sonnet", StopReason: llm.StopEndTurn,
		Content: []llm.Block{{Type: llm.BlockText, Text: text}}, Usage: llm.Usage{InputTokens: 3, OutputTokens: 2}},
		ServedRoute: &sonnet, Attempts: 1}
	ev := job.Event{Type: job.EventCompleted, Result: job.ResultOf(st)}
	if _, err := m.Apply(context.Background(), id, job.Change{Tenant: "t", Status: job.StatusCompleted, State: &st, Event: &ev}); err != nil {
		t.Fatalf("complete %s: %v", id, err)
	}
}

// status returns id's status.
func (m *memJobs) status(id string) job.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r, ok := m.recs[id]; ok {
		return r.Status
	}
	return ""
}

// memFinisher ends requests in memJobs with their terminal event.
type memFinisher struct{ jobs *memJobs }

func (f memFinisher) Finish(ctx context.Context, rec *job.Record, e finish.Ending) error {
	st := e.State
	ev := job.Event{Type: job.EventCompleted, Code: e.Code, Result: job.ResultOf(st)}
	switch e.Status {
	case job.StatusCancelled:
		ev.Type = job.EventCancelled
	case job.StatusFailed:
		ev.Type = job.EventFailed
	}
	reason := finish.TenantReason(rec.Job, e.Code, e.Reason)
	_, err := f.jobs.Apply(ctx, rec.Job.ID, job.Change{Tenant: "t", Status: e.Status, State: &st, Code: e.Code,
		Reason: reason, Event: &ev})
	if errors.Is(err, job.ErrTerminal) || errors.Is(err, job.ErrNotFound) {
		return fmt.Errorf("finish %s: %w", rec.Job.ID, finish.ErrEnded)
	}
	if err == nil { // as finish.Finisher: rec matches what was written
		rec.Status, rec.State, rec.Code, rec.Reason = e.Status, st, e.Code, reason
	}
	return err
}

// FinishNew stores j and ends it (the store does both in one script).
func (f memFinisher) FinishNew(ctx context.Context, j *job.Job, idemKey string, e finish.Ending) (*job.Record, string, bool, error) {
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
func (f memFinisher) EndUnstored(_ context.Context, j *job.Job, e finish.Ending) (*job.Record, error) {
	return &job.Record{Job: *j, Status: e.Status, State: e.State, Code: e.Code}, nil
}

// memQueue is every queue: intake's, the API's and the hub's positioner.
type memQueue struct {
	prefix   string
	enqueued chan string // every enqueued id
	admitErr error

	mu        sync.Mutex
	spot      queue.Spot // of every queued request
	queued    []string
	cancelled []string
}

func (q *memQueue) Admit(context.Context) error { return q.admitErr }

func (q *memQueue) Enqueue(_ context.Context, id string, _ priority.Priority, _ time.Duration) error {
	q.mu.Lock()
	q.queued = append(q.queued, id)
	q.mu.Unlock()
	q.enqueued <- id
	return nil
}

func (q *memQueue) SpotOf(_ context.Context, id string) (queue.Spot, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if slices.Contains(q.queued, id) && !slices.Contains(q.cancelled, id) {
		return q.spot, nil
	}
	return queue.Spot{}, nil
}

func (q *memQueue) Cancel(_ context.Context, id string, _ priority.Priority) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.cancelled = append(q.cancelled, id)
	return true, nil
}

func (q *memQueue) Rate(context.Context) (float64, error) { return 1, nil }

func (q *memQueue) Spots(ctx context.Context) (map[string]queue.Spot, error) {
	out := map[string]queue.Spot{}
	for _, id := range q.ids() {
		out[id], _ = q.SpotOf(ctx, id)
	}
	return out, nil
}

func (q *memQueue) DequeuedChannel() string { return q.prefix + "dequeued" }

func (q *memQueue) ids() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.queued)
}

func (q *memQueue) cancels() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	return slices.Clone(q.cancelled)
}

// Intake's other collaborators.
type (
	memBreakers struct{ open bool } // the "all" breaker
	memCache    struct{ hit *llm.Response }
	memLimiter  struct{ deny bool }
)

func (b memBreakers) Status(_ context.Context, name string) (breaker.Status, error) {
	if b.open && name == breaker.AllName {
		return breaker.Status{Name: name, State: breaker.StateOpen, RetryAt: time.Now().Add(42 * time.Second)}, nil
	}
	return breaker.Status{Name: name, State: breaker.StateClosed}, nil
}

func (c memCache) Ref(j *job.Job) string { return j.Tenant + "|" + j.Request.Messages[0].Text() }
func (c memCache) AnswerFor(context.Context, *job.Job) (cache.Found, error) {
	if c.hit == nil {
		return cache.Found{Kind: job.CachedNone}, nil
	}
	return cache.Found{Kind: job.CachedExact, Age: time.Minute, Answer: cache.Answer{Route: sonnet, Response: c.hit}}, nil
}
func (c memCache) ExactAnswerFor(ctx context.Context, j *job.Job) (cache.Found, error) {
	return c.AnswerFor(ctx, j)
}

func (l memLimiter) Allow(context.Context, string, int) (bool, time.Duration, error) {
	return !l.deny, 9 * time.Second, nil
}

// The admin side and the rest of the API's optional collaborators.
type (
	memHistory map[string]*history.Row
	memModels  map[string]llm.Route
	memAdmin   struct {
		mu    sync.Mutex
		calls []string
	}
)

func (h memHistory) Get(_ context.Context, id string) (*history.Row, error) {
	if r, ok := h[id]; ok {
		return r, nil
	}
	return nil, history.ErrNotFound
}

func (m memModels) Resolve(model string) (llm.Route, bool) { r, ok := m[model]; return r, ok }

// List gives every name sonnet's limit in the fake intake (4096).
func (m memModels) List() []llm.Model {
	var out []llm.Model
	for id, r := range m {
		out = append(out, llm.Model{ID: id, Route: r, MaxOutputTokens: 4096})
	}
	slices.SortFunc(out, func(a, b llm.Model) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func (a *memAdmin) call(s string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.calls = append(a.calls, s)
}

func (a *memAdmin) list() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

func (a *memAdmin) Snapshot(context.Context) ([]keypool.KeyState, error) {
	return []keypool.KeyState{{ID: "k1", Provider: llm.ProviderClaude, Tier: "sonnet"}}, nil
}
func (a *memAdmin) Enable(_ context.Context, id string) error { a.call("enable " + id); return nil }
func (a *memAdmin) Disable(_ context.Context, id, reason string) error {
	a.call("disable " + id + " " + reason)
	return nil
}
func (a *memAdmin) List(context.Context) ([]breaker.Status, error) {
	return []breaker.Status{{Name: "all", State: breaker.StateClosed}}, nil
}
func (a *memAdmin) Reset(_ context.Context, name string) error { a.call("reset " + name); return nil }
func (a *memAdmin) InvalidateCase(_ context.Context, tenant, caseID string) (int64, error) {
	a.call("case " + tenant + " " + caseID)
	return 3, nil
}
func (a *memAdmin) InvalidateNamespace(_ context.Context, tenant, layer string) (int64, error) {
	a.call("namespace " + tenant + " " + layer)
	return 7, nil
}

// setup holds what a test may change before the server is built.
type setup struct {
	cfg      httpapi.Config
	deps     httpapi.Deps
	breakers memBreakers
	cache    memCache
	limiter  memLimiter
	admitErr error
	// listen, if set, wraps the API's listener (deadline_test.go).
	listen func(net.Listener) net.Listener
}

// server is the API under test.
type server struct {
	url string
	// adminURL is the admin listener's, with Config.AdminApart only.
	adminURL string
	jobs     *memJobs
	queue    *memQueue
	admin    *memAdmin
	hub      *progress.Hub
}

// newServer serves the API on fakes; edit may change the setup.
func newServer(t *testing.T, edit func(*setup)) *server {
	t.Helper()
	rdb := testenv.Redis(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	prefix := "httpapi-" + hex.EncodeToString(b) + ":" // pub/sub is server-wide
	jobs := &memJobs{rdb: rdb, channel: prefix + "events", gets: make(chan string, 256),
		recs: map[string]*job.Record{}, joins: map[string]string{}, events: map[string][]job.Event{}}
	q := &memQueue{prefix: prefix, enqueued: make(chan string, 256), spot: queue.Spot{Position: 2, ETA: 2500 * time.Millisecond}}
	admin := &memAdmin{}
	tenants := map[string]intake.Tenant{}
	for tok, tn := range map[string]intake.Tenant{
		tokAcme:    {Name: "acme", MaxPriority: priority.High},
		tokGlobex:  {Name: "globex"},
		tokLimited: {Name: "limited", RateLimitRPM: 60, MaxQueued: 1, MaxStreams: 1, MaxSyncWaits: 1},
	} {
		tenants[secret.New(tok).SHA256()] = tn
	}
	su := &setup{
		cfg: httpapi.Config{Tenants: tenants, AdminToken: secret.New(tokAdmin), SyncTimeout: 30 * time.Second},
		deps: httpapi.Deps{Jobs: jobs, Queue: q, History: memHistory{}, Keys: admin, Breakers: admin, Cache: admin,
			Models: memModels{"gpt-4o": sonnet, "claude-sonnet": sonnet}, Logger: slog.New(slog.DiscardHandler),
			Ready: map[string]httpapi.Pinger{"redis": func(ctx context.Context) error { return rdb.Ping(ctx).Err() }}},
	}
	if edit != nil {
		edit(su)
	}
	q.admitErr = su.admitErr
	su.deps.Intake = intake.New(intake.Config{
		Routes:  map[llm.Route]bool{sonnet: true},
		MaxWait: time.Minute, MaxPromptChars: 10_000, MaxTokensLimit: 4096, DefaultMaxTokens: 512, CacheEnabled: true,
	}, intake.Deps{Jobs: jobs, Finisher: memFinisher{jobs}, Queue: q, Breakers: su.breakers, Cache: su.cache,
		RateLimiter: su.limiter, Logger: su.deps.Logger})
	hub := progress.New(rdb, q, progress.Config{Channel: jobs.channel, Tick: time.Hour, KeepAlive: time.Hour}, su.deps.Logger)
	su.deps.Hub = hub
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("hub: %v", err)
		}
	})
	awaitHub(t, hub, rdb, jobs.channel)
	api, adm := httpapi.New(su.cfg, su.deps)
	srv := httptest.NewUnstartedServer(api)
	if su.listen != nil {
		srv.Listener = su.listen(srv.Listener)
	}
	srv.Start()
	t.Cleanup(srv.Close)
	out := &server{url: srv.URL, jobs: jobs, queue: q, admin: admin, hub: hub}
	if adm != nil {
		asrv := httptest.NewServer(adm)
		t.Cleanup(asrv.Close)
		out.adminURL = asrv.URL
	}
	return out
}

// awaitHub returns once the hub hands on what is published on channel: a
// probe is published until it arrives.
func awaitHub(t *testing.T, hub *progress.Hub, rdb *redis.Client, channel string) {
	t.Helper()
	sub := hub.Subscribe("probe", "en")
	defer sub.Close()
	timeout := time.After(10 * time.Second)
	for {
		if err := rdb.Publish(context.Background(), channel, `probe 1-1 {"type":"queued"}`).Err(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-sub.C:
			return
		case <-time.After(20 * time.Millisecond): // not subscribed yet: publish again
		case <-timeout:
			t.Fatal("the hub never received a probe")
		}
	}
}
