package maintenance

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/finish"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// fakeJobs is the live store in memory (LiveJobs and JobStore).
type fakeJobs struct {
	mu        sync.Mutex
	recs      map[string]*job.Record
	live      []string
	getErr    map[string]error
	olderThan time.Time
	swept     chan struct{} // a signal per Live call
	forgotten []string
	changes   map[string][]job.Change
}

func newFakeJobs(recs ...*job.Record) *fakeJobs {
	f := &fakeJobs{recs: map[string]*job.Record{}, getErr: map[string]error{}, changes: map[string][]job.Change{},
		swept: make(chan struct{}, 64)}
	for _, r := range recs {
		f.recs[r.Job.ID] = r
		f.live = append(f.live, r.Job.ID)
	}
	return f
}

func (f *fakeJobs) Get(_ context.Context, id string) (*job.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.getErr[id]; err != nil {
		return nil, err
	}
	r, ok := f.recs[id]
	if !ok {
		return nil, job.ErrNotFound
	}
	cp := *r
	return &cp, nil
}

func (f *fakeJobs) Apply(_ context.Context, id string, c job.Change) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.State != nil {
		st := *c.State
		c.State = &st
		f.recs[id].State = st
	}
	f.changes[id] = append(f.changes[id], c)
	return "1-0", nil
}

func (f *fakeJobs) Live(_ context.Context, olderThan time.Time, _ int) ([]string, error) {
	f.mu.Lock()
	f.olderThan = olderThan
	ids := slices.Clone(f.live)
	f.mu.Unlock()
	select {
	case f.swept <- struct{}{}:
	default:
	}
	return ids, nil
}

func (f *fakeJobs) Forget(_ context.Context, id string) error {
	f.mu.Lock()
	f.forgotten = append(f.forgotten, id)
	f.mu.Unlock()
	return nil
}

func (f *fakeJobs) sweeps() int { return len(f.swept) }

type requeueReply struct {
	requeued, archived bool
	err                error
}

type fakeQueue struct {
	mu      sync.Mutex
	replies map[string]requeueReply
	calls   []string // "id priority"
}

func (q *fakeQueue) Requeue(_ context.Context, id string, p priority.Priority) (bool, bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, id+" "+p.String())
	r := q.replies[id]
	return r.requeued, r.archived, r.err
}

type fakeFinisher struct {
	mu   sync.Mutex
	ends map[string]finish.Ending
	err  error
}

func (f *fakeFinisher) Finish(_ context.Context, rec *job.Record, e finish.Ending) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ends[rec.Job.ID] = e
	return f.err
}

type fakeReplayer struct {
	mu    sync.Mutex
	calls int
	err   error
}

func (r *fakeReplayer) Replay(context.Context) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return 0, r.err
}

type sweepFixture struct {
	jobs   *fakeJobs
	queue  *fakeQueue
	fin    *fakeFinisher
	replay *fakeReplayer
	sw     *Sweeper
}

// newSweep wires a sweeper to the fakes; its lock lives in rdb under a
// prefix of its own.
func newSweep(t *testing.T, rdb redis.Cmdable, every time.Duration, recs ...*job.Record) *sweepFixture {
	f := &sweepFixture{jobs: newFakeJobs(recs...), queue: &fakeQueue{replies: map[string]requeueReply{}},
		fin: &fakeFinisher{ends: map[string]finish.Ending{}}, replay: &fakeReplayer{}}
	f.sw = NewSweeper(SweeperDeps{Jobs: f.jobs, Queue: f.queue, Finisher: f.fin, History: f.replay, Redis: rdb,
		Prefix: t.Name() + ":", Logger: slog.New(slog.DiscardHandler), Every: every})
	return f
}

// request is a live request created a minute ago, due in a minute.
func request(id string, status job.Status) *job.Record {
	created := time.Now().Add(-time.Minute)
	return &job.Record{Status: status, Job: job.Job{ID: id, Tenant: "demo", Priority: priority.High,
		Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}, CreatedAt: created, Deadline: created.Add(2 * time.Minute)}}
}

// A request with no task is enqueued again (at its priority); one whose
// task asynq archived fails as lost; ended or vanished ones leave the live
// set. Only requests older than Age are looked at.
func TestSweepOrphans(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	f := newSweep(t, rdb, time.Minute, request("orphan", job.StatusQueued), request("archived", job.StatusWaiting),
		request("done", job.StatusCompleted), request("has-task", job.StatusRunning))
	f.jobs.live = append(f.jobs.live, "vanished")
	f.queue.replies["orphan"] = requeueReply{requeued: true}
	f.queue.replies["archived"] = requeueReply{archived: true}
	before := time.Now()
	if err := f.sw.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if lo, hi := before.Add(-OrphanAgeDefault), time.Now().Add(-OrphanAgeDefault); f.jobs.olderThan.Before(lo) || f.jobs.olderThan.After(hi) {
		t.Fatalf("looked at requests older than %s, want now - %s", f.jobs.olderThan, OrphanAgeDefault)
	}
	if want := []string{"orphan high", "archived high", "has-task high"}; !slices.Equal(f.queue.calls, want) {
		t.Fatalf("requeue calls %v, want %v", f.queue.calls, want)
	}
	if len(f.fin.ends) != 1 {
		t.Fatalf("endings %v, want only the archived request's", f.fin.ends)
	}
	if e := f.fin.ends["archived"]; e.Status != job.StatusFailed || e.Code != job.CodeLost || !strings.Contains(e.Reason, "archived") {
		t.Fatalf("archived request's ending %+v", e)
	}
	if !slices.Equal(f.jobs.forgotten, []string{"done", "vanished"}) {
		t.Fatalf("forgotten %v, want the ended and the vanished request", f.jobs.forgotten)
	}
	if f.replay.calls != 1 {
		t.Fatalf("history replayed %d times per sweep, want 1", f.replay.calls)
	}
}

// A coalesced follower waits for its leader; it fails on its own deadline
// only while the shared call has not started; once the leader ends, it
// gets the leader's answer or shared failure, or a call of its own.
func TestSweepFollowers(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	answer := &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "shared"}}}
	served := llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
	tests := []struct {
		name   string
		leader func(*job.Record) // nil: the leader is gone
		late   bool              // the follower is past its deadline
		want   string            // "nothing", "deadline", "answer", "shared failure", "own call"
	}{
		{"leader queued", func(l *job.Record) { l.Status = job.StatusQueued }, false, "nothing"},
		{"leader queued, follower late", func(l *job.Record) { l.Status = job.StatusQueued }, true, "deadline"},
		{"leader running, follower late", func(l *job.Record) { l.Status, l.State.StartedAt = job.StatusRunning, time.Now() }, true, "nothing"},
		{"leader completed", func(l *job.Record) {
			l.Status, l.State.Result, l.State.ServedRoute, l.State.KeyID, l.State.FinishedAt = job.StatusCompleted, answer, &served, "k1", time.Now()
		}, false, "answer"},
		{"leader failed provider_error", func(l *job.Record) {
			l.Status, l.Code, l.Reason = job.StatusFailed, job.CodeProviderError, "provider_error: refused (request leader)"
		}, false, "shared failure"},
		{"leader failed its own deadline", func(l *job.Record) { l.Status, l.Code = job.StatusFailed, job.CodeDeadline }, false, "own call"},
		{"leader cancelled", func(l *job.Record) { l.Status, l.Code = job.StatusCancelled, job.CodeCancelled }, false, "own call"},
		{"leader gone", nil, false, "own call"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			follower := request("follower", job.StatusQueued)
			follower.Job.Priority = priority.Low
			follower.State.CoalescedInto, follower.State.Cached = "leader", "coalesced"
			if tc.late {
				follower.Job.Deadline = time.Now().Add(-time.Second)
			}
			f := newSweep(t, rdb, time.Minute, follower)
			if tc.leader != nil {
				leader := request("leader", job.StatusQueued)
				tc.leader(leader)
				f.jobs.recs["leader"] = leader
			}
			if err := f.sw.Sweep(t.Context()); err != nil {
				t.Fatal(err)
			}
			e, ended := f.fin.ends["follower"]
			if _, leaderEnded := f.fin.ends["leader"]; leaderEnded {
				t.Fatal("the sweep ended the leader")
			}
			switch tc.want {
			case "nothing":
				if ended || len(f.queue.calls) != 0 || len(f.jobs.changes["follower"]) != 0 {
					t.Fatalf("the follower was touched: ending %+v, requeues %v", e, f.queue.calls)
				}
			case "deadline":
				if e.Status != job.StatusFailed || e.Code != job.CodeDeadline || !strings.Contains(e.Reason, "identical request") {
					t.Fatalf("ending %+v, want its own deadline", e)
				}
			case "answer":
				st := e.State
				if e.Status != job.StatusCompleted || st.Cached != "coalesced" || st.CoalescedInto != "leader" || st.KeyID != "" ||
					!st.FinishedAt.IsZero() || st.Result != answer || st.ServedRoute == nil || *st.ServedRoute != served {
					t.Fatalf("ending %+v, want the leader's answer as coalesced, with no key and its own finish time", e)
				}
			case "shared failure":
				if e.Status != job.StatusFailed || e.Code != job.CodeProviderError || e.Reason != "provider_error: refused (request leader)" {
					t.Fatalf("ending %+v, want the leader's failure", e)
				}
			case "own call":
				ch := f.jobs.changes["follower"]
				if ended || len(ch) != 1 || ch[0].State == nil || ch[0].State.CoalescedInto != "" || ch[0].State.Cached != "" {
					t.Fatalf("ending %+v, changes %+v; want the follower detached", e, ch)
				}
				if !slices.Equal(f.queue.calls, []string{"follower low"}) {
					t.Fatalf("requeues %v, want the follower at its own priority", f.queue.calls)
				}
			}
		})
	}
}

// One sweep at a time across processes (a Redis lock per prefix); an
// error on one request does not stop the others, nor does a history that
// cannot be replayed fail the sweep.
func TestSweepLockAndErrors(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	f := newSweep(t, rdb, time.Minute, request("broken", job.StatusQueued), request("orphan", job.StatusQueued))
	f.jobs.getErr["broken"] = errors.New("redis: i/o timeout")
	f.queue.replies["orphan"] = requeueReply{requeued: true}
	f.replay.err = errors.New("postgres still down")
	if err := f.sw.Sweep(t.Context()); err != nil {
		t.Fatalf("Sweep = %v", err)
	}
	if !slices.Equal(f.queue.calls, []string{"orphan high"}) {
		t.Fatalf("requeues %v: the error on one request stopped the sweep", f.queue.calls)
	}
	other := newSweep(t, rdb, time.Minute) // another worker, same prefix
	if err := other.sw.Sweep(t.Context()); err != nil || other.jobs.sweeps() != 0 {
		t.Fatalf("a second sweeper swept (%d) while the lock was held: %v", other.jobs.sweeps(), err)
	}
	if err := f.sw.Sweep(t.Context()); err != nil || f.jobs.sweeps() != 1 {
		t.Fatalf("the same sweeper swept again within Every (%d sweeps): %v", f.jobs.sweeps(), err)
	}
}

// Start sweeps every Every until Stop (idempotent, and harmless before
// Start) or the context ends.
func TestSweeperLoop(t *testing.T) {
	t.Parallel()
	rdb := testenv.Redis(t)
	f := newSweep(t, rdb, 20*time.Millisecond)
	NewSweeper(SweeperDeps{}).Stop() // never started
	f.sw.Start(t.Context())
	for range 2 { // the lock expires with each interval
		select {
		case <-f.jobs.swept:
		case <-time.After(10 * time.Second):
			t.Fatal("the sweeper did not sweep")
		}
	}
	f.sw.Stop()
	f.sw.Stop()
	select {
	case <-f.sw.done:
	default:
		t.Fatal("Stop returned before the loop ended")
	}

	g := newSweep(t, rdb, 20*time.Millisecond)
	ctx, cancel := context.WithCancel(t.Context())
	g.sw.Start(ctx)
	cancel()
	select {
	case <-g.sw.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the loop did not end with its context")
	}
}

// The expiry job fails queued requests past their deadline and removes
// their tasks; a request someone else ended meanwhile loses its task too;
// one whose ending could not be written keeps it, for the next run.
func TestExpireOverdueQueued(t *testing.T) {
	t.Parallel()
	overdue := func(id string) *job.Record {
		r := request(id, job.StatusQueued)
		r.Job.Deadline = time.Now().Add(-time.Second)
		return r
	}
	jobs := newFakeJobs(overdue("late"), overdue("ended-meanwhile"), overdue("write-fails"), request("on-time", job.StatusQueued))
	cancelled := overdue("cancelled")
	cancelled.Status = job.StatusCancelled
	jobs.recs["cancelled"] = cancelled
	q := &fakeQueues{pending: map[priority.Priority][]string{
		priority.High: {"late", "on-time", "cancelled", "missing"}, priority.Low: {"ended-meanwhile", "write-fails"}}}
	fin := &errFinisher{fakeFinisher: fakeFinisher{ends: map[string]finish.Ending{}},
		errs: map[string]error{"ended-meanwhile": fmt.Errorf("x: %w", finish.ErrEnded), "write-fails": errors.New("redis down")}}
	j := New(Deps{Jobs: jobs, Queues: q, Finisher: fin, Logger: slog.New(slog.DiscardHandler)})
	if err := j.expire(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	e := fin.ends["late"]
	if e.Status != job.StatusFailed || e.Code != job.CodeDeadline || !strings.Contains(e.Reason, "high queue") {
		t.Fatalf("overdue request's ending %+v", e)
	}
	for _, id := range []string{"on-time", "cancelled", "missing"} {
		if _, ok := fin.ends[id]; ok {
			t.Fatalf("%s was ended", id)
		}
	}
	if want := []string{"late high", "ended-meanwhile low"}; !slices.Equal(q.cancels, want) {
		t.Fatalf("tasks removed %v, want %v", q.cancels, want)
	}

	q.err = errors.New("redis down")
	if err := j.expire(t.Context(), nil); err == nil {
		t.Fatal("a failed read of the queues was not reported")
	}
	if err := New(Deps{}).expire(t.Context(), nil); err != nil {
		t.Fatalf("expiry without its collaborators: %v", err)
	}
}

type fakeQueues struct {
	pending map[priority.Priority][]string
	err     error
	cancels []string
}

func (q *fakeQueues) Pending(_ context.Context, p priority.Priority) ([]string, error) {
	return q.pending[p], q.err
}

func (q *fakeQueues) Cancel(_ context.Context, id string, p priority.Priority) (bool, error) {
	q.cancels = append(q.cancels, id+" "+p.String())
	return true, nil
}

// errFinisher fails the requests named in errs.
type errFinisher struct {
	fakeFinisher
	errs map[string]error
}

func (f *errFinisher) Finish(ctx context.Context, rec *job.Record, e finish.Ending) error {
	_ = f.fakeFinisher.Finish(ctx, rec, e)
	return f.errs[rec.Job.ID]
}
