package dispatch

// Small hand-written fakes of the interfaces dispatch declares, for the
// handler's unit tests. The slot limiter and the breakers are the real
// ones on the test's own Redis database (their *slots.Slot and
// *breaker.Permit cannot be built outside their packages): the fakes wrap
// them to count and to force a breaker open.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/secret"
	"bulwark/pkg/slots"
)

var (
	sonnet = llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	gpt4o  = llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
)

// trail is the order in which the fakes were used, across fakes.
type trail struct {
	mu  sync.Mutex
	ops []string
}

func (t *trail) add(op string) { t.mu.Lock(); t.ops = append(t.ops, op); t.mu.Unlock() }
func (t *trail) list() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Clone(t.ops)
}

// fakeJobs is a Jobs in memory. onApply, when set, runs before each Apply
// (outside the lock) and may refuse it.
type fakeJobs struct {
	mu      sync.Mutex
	recs    map[string]*job.Record
	changes map[string][]job.Change
	getErr  error
	onApply func(id string, c job.Change) error
}

func (f *fakeJobs) put(rec *job.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cp := *rec
	f.recs[rec.Job.ID] = &cp
}

func (f *fakeJobs) setStatus(id string, s job.Status) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs[id].Status = s
}

func (f *fakeJobs) GetWithEmbedding(_ context.Context, id string) (*job.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.getErr != nil {
		return nil, f.getErr
	}
	rec, ok := f.recs[id]
	if !ok {
		return nil, job.ErrNotFound
	}
	cp := *rec
	return &cp, nil
}

func (f *fakeJobs) Apply(_ context.Context, id string, c job.Change) (string, error) {
	f.mu.Lock()
	hook := f.onApply
	f.mu.Unlock()
	if hook != nil {
		if err := hook(id, c); err != nil {
			return "", err
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, ok := f.recs[id]
	if !ok {
		return "", job.ErrNotFound
	}
	if rec.Status.Terminal() {
		return "", fmt.Errorf("%w (%s)", job.ErrTerminal, rec.Status)
	}
	if c.State != nil {
		st := *c.State
		c.State = &st
		rec.State = st
	}
	if c.Status != "" {
		rec.Status = c.Status
	}
	f.changes[id] = append(f.changes[id], c)
	return "1-0", nil
}

func (f *fakeJobs) record(id string) job.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *f.recs[id]
}

// events returns the events applied to id, in order.
func (f *fakeJobs) events(id string) []job.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	var evs []job.Event
	for _, c := range f.changes[id] {
		if c.Event != nil {
			evs = append(evs, *c.Event)
		}
	}
	return evs
}

func (f *fakeJobs) eventsOf(id string, typ job.EventType) []job.Event {
	var out []job.Event
	for _, ev := range f.events(id) {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

type fakeStarts struct {
	mu  sync.Mutex
	ids []string
}

func (f *fakeStarts) RecordStart(_ context.Context, id string) error {
	f.mu.Lock()
	f.ids = append(f.ids, id)
	f.mu.Unlock()
	return nil
}

func (f *fakeStarts) count() int { f.mu.Lock(); defer f.mu.Unlock(); return len(f.ids) }

// countingSlots hands out real slots and counts the asks; with err set
// it answers that instead (Redis failing).
type countingSlots struct {
	lim *slots.Limiter
	mu  sync.Mutex
	n   int
	err error
}

func (s *countingSlots) Acquire(ctx context.Context, p priority.Priority, w slots.Waiter) (*slots.Slot, error) {
	s.mu.Lock()
	s.n++
	err := s.err
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.lim.Acquire(ctx, p, w)
}

func (s *countingSlots) asks() int { s.mu.Lock(); defer s.mu.Unlock(); return s.n }

// inUse is the number of slots held now, in Redis.
func (s *countingSlots) inUse(t *testing.T) int {
	t.Helper()
	m, err := s.lim.InUse(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// fakePool grants leases from a script per route, then a fresh key each
// time, and records every settlement.
type fakePool struct {
	mu       sync.Mutex
	script   map[llm.Route][]error // nil entry: grant
	next     map[llm.Route]int
	delay    time.Duration // NotBefore of granted leases, after GrantedAt
	acquires []llm.Route
	settles  []string // "<op> <key>", op one of success, cool, disable, refund, release, return
}

func (p *fakePool) Acquire(_ context.Context, r llm.Route, _ int, _ ...keypool.AcquireOption) (*keypool.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.acquires = append(p.acquires, r)
	if q := p.script[r]; len(q) > 0 {
		p.script[r] = q[1:]
		if q[0] != nil {
			return nil, q[0]
		}
	}
	p.next[r]++
	id := fmt.Sprintf("%s-%d", r.Tier, p.next[r])
	now := time.Now()
	return &keypool.Lease{ID: "lease-" + id, KeyID: id, Route: r, Cred: llm.Credential{KeyID: id, APIKey: secret.New("sk-" + id)},
		GrantedAt: now, NotBefore: now.Add(p.delay), ExpiresAt: now.Add(time.Minute)}, nil
}

func (p *fakePool) settle(op string, l *keypool.Lease) {
	p.mu.Lock()
	p.settles = append(p.settles, op+" "+l.KeyID)
	p.mu.Unlock()
}

func (p *fakePool) Success(_ context.Context, l *keypool.Lease, _ llm.Usage, _ llm.RateLimit) error {
	p.settle("success", l)
	return nil
}

func (p *fakePool) Failure(_ context.Context, l *keypool.Lease, a keypool.Action, _ error) error {
	p.settle(map[keypool.Action]string{keypool.Refund: "refund", keypool.Cool: "cool", keypool.Disable: "disable", keypool.Full: "full"}[a], l)
	return nil
}

func (p *fakePool) Release(_ context.Context, l *keypool.Lease) error {
	p.settle("release", l)
	return nil
}
func (p *fakePool) Return(_ context.Context, l *keypool.Lease) error {
	p.settle("return", l)
	return nil
}

func (p *fakePool) Leave(context.Context, llm.Route, string) error { return nil }

func (p *fakePool) settled() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.settles)
}
func (p *fakePool) asked(r llm.Route) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, a := range p.acquires {
		if a == r {
			n++
		}
	}
	return n
}

// fakeBreakers passes to the real breakers, except for the names forced
// open.
type fakeBreakers struct {
	set  *breaker.Set
	mu   sync.Mutex
	open map[string]*breaker.OpenError
}

func (b *fakeBreakers) Allow(ctx context.Context, name string) (*breaker.Permit, error) {
	b.mu.Lock()
	oe := b.open[name]
	b.mu.Unlock()
	if oe != nil {
		return nil, oe
	}
	return b.set.Allow(ctx, name)
}

// failures is the breaker's count of consecutive failures, in Redis.
func (b *fakeBreakers) failures(t *testing.T, name string) int {
	t.Helper()
	st, err := b.set.Status(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st.ConsecutiveFailures
}

type fakeFinisher struct {
	jobs  *fakeJobs
	trail *trail
	mu    sync.Mutex
	ends  []finish.Ending
	errs  []error // returned by the first calls, in order
}

func (f *fakeFinisher) Finish(_ context.Context, rec *job.Record, e finish.Ending) error {
	f.mu.Lock()
	f.ends = append(f.ends, e)
	var err error
	if len(f.errs) > 0 {
		err, f.errs = f.errs[0], f.errs[1:]
	}
	f.mu.Unlock()
	f.trail.add("finish " + string(e.Status))
	if err != nil {
		return err
	}
	if f.jobs.record(rec.Job.ID).Status.Terminal() {
		return finish.ErrEnded
	}
	f.jobs.setStatus(rec.Job.ID, e.Status)
	return nil
}

func (f *fakeFinisher) endings() []finish.Ending {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ends)
}

type fakeAlerter struct {
	mu     sync.Mutex
	alerts []string
}

func (a *fakeAlerter) KeyDisabled(_ context.Context, keyID string, r llm.Route, reason string) {
	a.mu.Lock()
	a.alerts = append(a.alerts, keyID+" "+r.String()+" "+reason)
	a.mu.Unlock()
}

// fakeClient answers from a script of replies, then "ok", and signals
// each call on called.
type fakeClient struct {
	provider llm.Provider
	mu       sync.Mutex
	script   []func(ctx context.Context) (*llm.Result, error)
	calls    []string // "<api key> <model>"
	sent     []int    // each call's max_tokens
	called   chan string
}

func (c *fakeClient) Provider() llm.Provider { return c.provider }

func (c *fakeClient) Complete(ctx context.Context, cred llm.Credential, req *llm.Request) (*llm.Result, error) {
	call := cred.APIKey.Reveal() + " " + req.Model
	c.mu.Lock()
	c.calls = append(c.calls, call)
	c.sent = append(c.sent, req.MaxTokens)
	var reply func(context.Context) (*llm.Result, error)
	if len(c.script) > 0 {
		reply, c.script = c.script[0], c.script[1:]
	}
	c.mu.Unlock()
	select {
	case c.called <- call:
	default:
	}
	if reply != nil {
		return reply(ctx)
	}
	return answer("ok"), nil
}

func (c *fakeClient) then(replies ...func(context.Context) (*llm.Result, error)) {
	c.mu.Lock()
	c.script = append(c.script, replies...)
	c.mu.Unlock()
}

func (c *fakeClient) callList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func (c *fakeClient) maxTokensSent() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sent)
}

func answer(text string) *llm.Result {
	return &llm.Result{Response: &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: text}},
		StopReason: llm.StopEndTurn, Usage: llm.Usage{InputTokens: 10, OutputTokens: 5}}}
}

// failWith is a reply failing with class; the message stands for what a
// provider says, which must never reach the caller.
func failWith(class llm.Class) func(context.Context) (*llm.Result, error) {
	return func(context.Context) (*llm.Result, error) {
		return nil, &llm.Error{Class: class, Status: 400, Message: "provider detail 7f3a"}
	}
}
