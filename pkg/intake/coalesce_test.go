package intake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"bulwark/pkg/cache"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
)

// A cache hit completes the request at once, through the Finisher, with
// the cached answer and its route; nothing is enqueued and the tenant's
// share is not taken (a full tenant still gets it).
func TestSubmitCacheHit(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.cache.found = cache.Found{Kind: job.CachedSemantic, Similarity: 0.97, Age: 3 * time.Minute,
		Answer: cache.Answer{Route: gpt4o, Response: answer("from cache")}}
	tn := demo
	tn.MaxQueued = 1
	r.jobs.put(job.Record{Job: job.Job{ID: "busy", Tenant: "demo"}, Status: job.StatusRunning})
	a := r.submit(t, tn, ask("q"))
	if a.Status != job.StatusCompleted || a.Cached != job.CachedSemantic || a.Similarity != 0.97 || a.CacheAge != 3*time.Minute ||
		a.Result == nil || a.Result.Content != "from cache" || a.Result.Provider != gpt4o.Provider || a.Result.Cached != job.CachedSemantic {
		t.Fatalf("accepted %+v (result %+v)", a, a.Result)
	}
	ends := r.finisher.endings()
	if len(ends) != 1 || ends[0].id != a.ID || ends[0].e.Status != job.StatusCompleted ||
		ends[0].e.State.Cached != job.CachedSemantic || *ends[0].e.State.ServedRoute != gpt4o {
		t.Fatalf("endings %+v, want %s completed from the cache on %s", ends, a.ID, gpt4o)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 0 {
		t.Fatalf("a cache hit was enqueued: %v", enq)
	}
	if got := r.jobs.maxLive; len(got) != 1 || got[0] != 0 {
		t.Fatalf("stored with limits %v, want none", got)
	}
	if v := value(t, r.metrics.CacheLookups.WithLabelValues("agent", metrics.CacheResultSemantic)); v != 1 {
		t.Fatalf("lookups{agent,semantic} = %v", v)
	}

	// An exact entry without a route is served as the request's own route.
	r = newRig(nil)
	r.cache.found = cache.Found{Kind: job.CachedExact, Answer: cache.Answer{Response: answer("exact")}}
	a = r.submit(t, demo, ask("q"))
	if ends := r.finisher.endings(); a.Cached != job.CachedExact || len(ends) != 1 || *ends[0].e.State.ServedRoute != sonnet {
		t.Fatalf("exact hit %+v, endings %+v", a, ends)
	}
}

// A compat caller's hit (it waits for the answer) without an
// Idempotency-Key ends with no live record: nothing to look it up by but
// its id, which history answers. With a key, or for the async API, the
// hit is stored (ended) as before, so the key finds it again.
func TestSubmitCacheHitOfAWaitingCaller(t *testing.T) {
	t.Parallel()
	hit := cache.Found{Kind: job.CachedExact, Answer: cache.Answer{Route: gpt4o, Response: answer("from cache")}}
	for _, tt := range []struct {
		name     string
		waited   bool
		idem     string
		unstored bool
	}{
		{"compat", true, "", true},
		{"compat with a key", true, "k1", false},
		{"async", false, "", false},
	} {
		r := newRig(nil)
		r.cache.found = hit
		s := ask("q")
		s.Waited, s.IdempotencyKey = tt.waited, tt.idem
		a := r.submit(t, demo, s)
		if a.Status != job.StatusCompleted || a.Result == nil || a.Result.Content != "from cache" || a.Ended == nil ||
			a.Ended.Status != job.StatusCompleted || a.Ended.Job.ID != a.ID {
			t.Fatalf("%s: accepted %+v", tt.name, a)
		}
		ends := r.finisher.endings()
		if len(ends) != 1 || ends[0].id != a.ID {
			t.Fatalf("%s: endings %+v, want one of %s", tt.name, ends, a.ID)
		}
		_, err := r.jobs.Get(context.Background(), a.ID)
		stored := err == nil
		if unstored := r.finisher.unstored == 1; unstored != tt.unstored || stored == tt.unstored {
			t.Fatalf("%s: ended without a record %v, record stored %v; want without a record %v", tt.name, unstored, stored, tt.unstored)
		}
	}
}

// A caller that opts out of reading the cache is neither looked up nor
// coalesced; the bypass is counted.
func TestSubmitCacheBypass(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.cache.found = cache.Found{Kind: job.CachedExact, Answer: cache.Answer{Response: answer("stale")}}
	s := ask("q")
	s.NoCacheRead = true
	a, b := r.submit(t, demo, s), r.submit(t, demo, s)
	if a.Status != job.StatusQueued || b.CoalescedInto != "" {
		t.Fatalf("bypass: %+v %+v", a, b)
	}
	if lookups, exact := r.cache.reads(); lookups != 0 || exact != 0 {
		t.Fatalf("cache read %d+%d times", lookups, exact)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 2 {
		t.Fatalf("enqueued %v, want both", enq)
	}
	if v := value(t, r.metrics.CacheLookups.WithLabelValues("agent", metrics.CacheResultBypass)); v != 2 {
		t.Fatalf("lookups{agent,bypass} = %v", v)
	}
}

// A cache that fails is bypassed (fail open): the request is queued, and
// the outage counted.
func TestSubmitCacheErrorFailsOpen(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.cache.err = errors.New("postgres down")
	a := r.submit(t, demo, ask("q"))
	if a.Status != job.StatusQueued {
		t.Fatalf("accepted %+v", a)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 1 || enq[0].id != a.ID {
		t.Fatalf("enqueued %v", enq)
	}
	if v := value(t, r.metrics.CacheUnavailable); v != 1 {
		t.Fatalf("cache_unavailable = %v", v)
	}
	if v := value(t, r.metrics.CacheLookups.WithLabelValues("agent", metrics.CacheResultError)); v != 1 {
		t.Fatalf("lookups{agent,error} = %v", v)
	}
}

// An identical request in flight is joined: the second request points at
// the first, is not enqueued, and gets the leader's position.
func TestCoalesceJoinsTheLeader(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	lead := r.submit(t, demo, ask("same"))
	follow := r.submit(t, demo, ask("same"))
	other := r.submit(t, demo, ask("different"))
	if follow.CoalescedInto != lead.ID || follow.ID == lead.ID || follow.Status != job.StatusQueued ||
		follow.Position != 3 || follow.ETA != 4500*time.Millisecond || follow.Message == "" {
		t.Fatalf("follower %+v, want joined to %s", follow, lead.ID)
	}
	if other.CoalescedInto != "" || lead.CoalescedInto != "" {
		t.Fatalf("coalesced what differs: %+v %+v", lead, other)
	}
	enq, _ := r.queue.tasks()
	if len(enq) != 2 || enq[0].id != lead.ID || enq[1].id != other.ID {
		t.Fatalf("enqueued %v, want the leader and the other request only", enq)
	}
	ch := r.jobs.changes(follow.ID)
	if len(ch) != 1 || ch[0].State == nil || ch[0].State.CoalescedInto != lead.ID || ch[0].State.Cached != job.CachedCoalesced {
		t.Fatalf("follower's changes %+v", ch)
	}
	rows := r.history.rows()
	if len(rows) != 3 || rows[1] != follow.ID+" queued coalesced" {
		t.Fatalf("history %v", rows)
	}
	if v := value(t, r.metrics.Coalesced); v != 1 {
		t.Fatalf("coalesced = %v", v)
	}
	if p := r.promoter.calls(); len(p) != 0 {
		t.Fatalf("promoted %v for an equally urgent follower", p)
	}
}

// A more urgent follower promotes the shared call; a less urgent one does
// not.
func TestCoalescePromotesTheLeader(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	tn := intake.Tenant{Name: "demo"}
	s := ask("same")
	s.Priority = priority.Low
	lead := r.submit(t, tn, s)
	s.Priority = priority.High
	high := r.submit(t, tn, s)
	s.Priority = priority.Low
	low := r.submit(t, tn, s)
	if high.CoalescedInto != lead.ID || low.CoalescedInto != lead.ID || high.Priority != priority.High {
		t.Fatalf("followers %+v %+v", high, low)
	}
	if p := r.promoter.calls(); len(p) != 1 || p[0] != lead.ID+" high" {
		t.Fatalf("promotions %v, want %s to high once", p, lead.ID)
	}
}

// A leader that has just completed hands its answer over; one that ended
// without an answer of its own leaves the follower to run its own call.
func TestCoalesceLeaderEnded(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	lead := r.submit(t, demo, ask("same"))
	if _, err := r.jobs.Apply(context.Background(), lead.ID, job.Change{Tenant: "t", Status: job.StatusCompleted,
		State: &job.State{Result: answer("shared"), ServedRoute: &sonnet, KeyID: "key-1"}}); err != nil {
		t.Fatal(err)
	}
	follow := r.submit(t, demo, ask("same"))
	if follow.Status != job.StatusCompleted || follow.Cached != job.CachedCoalesced || follow.Result == nil ||
		follow.Result.Content != "shared" || follow.Result.Cached != job.CachedCoalesced {
		t.Fatalf("follower of a completed leader %+v", follow)
	}
	ends := r.finisher.endings()
	if len(ends) != 1 || ends[0].id != follow.ID || ends[0].e.Status != job.StatusCompleted ||
		ends[0].e.State.CoalescedInto != lead.ID || ends[0].e.State.KeyID != "" {
		t.Fatalf("endings %+v, want the follower completed with the leader's answer", ends)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 1 {
		t.Fatalf("enqueued %v, want the leader only", enq)
	}

	r = newRig(nil)
	lead = r.submit(t, demo, ask("same"))
	if _, err := r.jobs.Apply(context.Background(), lead.ID, job.Change{Tenant: "t", Status: job.StatusFailed, Code: job.CodeDeadline}); err != nil {
		t.Fatal(err)
	}
	follow = r.submit(t, demo, ask("same"))
	if follow.CoalescedInto != "" || follow.Status != job.StatusQueued {
		t.Fatalf("follower of a failed leader %+v, want its own call", follow)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 2 || enq[1].id != follow.ID {
		t.Fatalf("enqueued %v, want the follower too", enq)
	}
	if v := value(t, r.metrics.Coalesced); v != 0 {
		t.Fatalf("coalesced = %v", v)
	}
}

// A request that misses the cache but wins the claim looks for the exact
// entry once more: an identical request answered in between ends it, and
// its claim is released, so nothing is enqueued and the next identical
// request leads again. A failing lookup is counted and the request runs.
func TestAnsweredMeanwhile(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.cache.exact = cache.Found{Kind: job.CachedExact, Answer: cache.Answer{Route: sonnet, Response: answer("meanwhile")}}
	a := r.submit(t, demo, ask("q"))
	if a.Status != job.StatusCompleted || a.Cached != job.CachedExact || a.Result == nil || a.Result.Content != "meanwhile" {
		t.Fatalf("accepted %+v", a)
	}
	if rel := r.claims.releases(); len(rel) != 1 || rel[0] != "demo|claude/sonnet|q "+a.ID {
		t.Fatalf("releases %v, want %s's claim", rel, a.ID)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 0 {
		t.Fatalf("enqueued %v", enq)
	}
	if lookups, exact := r.cache.reads(); lookups != 1 || exact != 1 {
		t.Fatalf("cache read %d, exact %d", lookups, exact)
	}
	if v := value(t, r.metrics.CacheLookups.WithLabelValues("agent", metrics.CacheResultExact)); v != 1 {
		t.Fatalf("lookups{agent,exact} = %v", v)
	}
	r.cache.mu.Lock()
	r.cache.exact = cache.Found{Kind: job.CachedNone}
	r.cache.mu.Unlock()
	if b := r.submit(t, demo, ask("q")); b.CoalescedInto != "" || b.Status != job.StatusQueued {
		t.Fatalf("next identical request %+v: the claim was kept", b)
	}

	r = newRig(nil)
	r.cache.exactErr = errors.New("postgres down")
	if a := r.submit(t, demo, ask("q")); a.Status != job.StatusQueued {
		t.Fatalf("exact lookup failed: %+v", a)
	}
	if v := value(t, r.metrics.CacheUnavailable); v != 1 {
		t.Fatalf("cache_unavailable = %v", v)
	}
}

// An Idempotency-Key retry of a follower is answered as the follower it
// is: joined to its leader, at the leader's place in the queue.
func TestIdempotentRetryOfAFollower(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	lead := r.submit(t, demo, ask("same"))
	s := ask("same")
	s.IdempotencyKey = "retry-me"
	follow := r.submit(t, demo, s)
	again := r.submit(t, demo, s)
	if !again.Existing || again.ID != follow.ID {
		t.Fatalf("retry %+v, want the follower %s again", again, follow.ID)
	}
	if again.CoalescedInto != lead.ID || again.Position != follow.Position || again.ETA != follow.ETA || again.Message == "" {
		t.Fatalf("retry %+v, want joined to %s at its place (%d, %s)", again, lead.ID, follow.Position, follow.ETA)
	}
}
