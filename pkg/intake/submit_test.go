package intake_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/finish"
	"bulwark/pkg/intake"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
	"bulwark/pkg/progress"
	"bulwark/pkg/queue"
)

// Bad input is refused with the HTTP status and the field at fault, before
// anything is stored, rate-limited or enqueued.
func TestSubmitValidation(t *testing.T) {
	t.Parallel()
	text := func(s string) []llm.Block { return []llm.Block{{Type: llm.BlockText, Text: s}} }
	for _, tt := range []struct {
		name   string
		edit   func(*intake.Submission)
		status int
		field  string
		says   string
	}{
		{"no messages", func(s *intake.Submission) { s.Request.Messages = nil }, 422, "messages", "at least one"},
		{"bad role", func(s *intake.Submission) { s.Request.Messages[0].Role = "system" }, 422, "messages[0].role", `"system"`},
		{"empty content", func(s *intake.Submission) { s.Request.Messages[0].Content = nil }, 422, "messages[0].content", "empty"},
		{"last from the assistant", func(s *intake.Submission) {
			s.Request.Messages = append(s.Request.Messages, llm.Message{Role: llm.RoleAssistant, Content: text("a")})
		}, 422, "messages", "from the user"},
		{"max_tokens over the limit", func(s *intake.Submission) { s.Request.MaxTokens = 4097 }, 422, "max_tokens", "between 1 and 4096"},
		{"negative max_tokens", func(s *intake.Submission) { s.Request.MaxTokens = -1 }, 422, "max_tokens", "got -1"},
		{"temperature", func(s *intake.Submission) { v := 2.5; s.Request.Temperature = &v }, 422, "temperature", "between 0 and 2"},
		{"unknown route", func(s *intake.Submission) { s.Route = llm.Route{Provider: llm.ProviderClaude, Tier: "opus"} }, 404, "model_tier", "claude/opus"},
		{"unknown layer", func(s *intake.Submission) { s.Layer = "nope" }, 422, "cache_layer", `"nope"`},
		{"bad priority", func(s *intake.Submission) { s.Priority = 9 }, 422, "priority", "critical, high"},
		{"prompt too long", func(s *intake.Submission) { s.Request.Messages[0].Content = text(strings.Repeat("x", 10_001)) }, 413, "messages", "limit is 10000"},
		{"NUL", func(s *intake.Submission) { s.Request.Messages[0].Content = text("a\x00b") }, 422, "messages[0].content[0]", "NUL"},
		{"control in a case id", func(s *intake.Submission) { s.CaseID = "c\n1" }, 422, "case_id", "control"},
	} {
		r := newRig(nil)
		r.limiter.deny = true // a validation error must come before the rate limit
		s := ask("q")
		tt.edit(&s)
		tn := demo
		tn.RateLimitRPM = 10
		_, err := r.in.Submit(context.Background(), tn, s)
		var ie *intake.InputError
		if !errors.As(err, &ie) || !errors.Is(err, intake.ErrInput) {
			t.Errorf("%s: err %v, want an *InputError", tt.name, err)
			continue
		}
		if ie.Status != tt.status || ie.Field != tt.field || !strings.Contains(ie.Message, tt.says) {
			t.Errorf("%s: %d %q %q, want %d %q containing %q", tt.name, ie.Status, ie.Field, ie.Message, tt.status, tt.field, tt.says)
		}
		enq, _ := r.queue.tasks()
		if r.jobs.count() != 0 || len(enq) != 0 || len(r.limiter.calls()) != 0 {
			t.Errorf("%s: stored %d, enqueued %d, rate-limited %d times", tt.name, r.jobs.count(), len(enq), len(r.limiter.calls()))
		}
	}
}

// An accepted request is stored with the defaults filled in, enqueued at
// its priority (the tenant's ceiling caps it) and answered with its
// position, ETA and message.
func TestSubmitQueued(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	tn := intake.Tenant{Name: "demo", DefaultPriority: priority.Low, MaxPriority: priority.High, DefaultLayer: "router"}
	s := ask("q")
	s.Priority = priority.Critical
	a := r.submit(t, tn, s)
	if a.Status != job.StatusQueued || a.Priority != priority.High || a.Position != 3 || a.ETA != 4500*time.Millisecond ||
		a.Message != progress.QueuedMessage("en", 3, 5) || a.Existing || a.Degraded {
		t.Fatalf("accepted %+v", a)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 1 || enq[0] != (task{a.ID, priority.High}) {
		t.Fatalf("enqueued %v, want %s at high (critical capped by the tenant)", enq, a.ID)
	}
	rec := r.jobs.record(t, a.ID)
	j := rec.Job
	if j.Tenant != "demo" || j.Request.MaxTokens != 1024 || j.Layer != "router" || j.CacheKey != "demo|claude/sonnet|q" ||
		!j.CacheRead || !j.CacheWrite || j.Deadline.Sub(j.CreatedAt) != time.Minute || j.KeepEnded != 0 {
		t.Fatalf("stored job %+v", j)
	}
	if got := r.history.rows(); len(got) != 1 || got[0] != a.ID+" queued none" {
		t.Fatalf("history %v", got)
	}
	if v := value(t, r.metrics.RequestsSubmitted.WithLabelValues("high")); v != 1 {
		t.Fatalf("submitted{high} = %v", v)
	}

	// Without an asked priority the tenant's default applies; without a
	// tenant layer, the configured one.
	b := r.submit(t, intake.Tenant{Name: "demo", DefaultPriority: priority.Low}, ask("other"))
	if b.Priority != priority.Low || r.jobs.record(t, b.ID).Job.Layer != "agent" {
		t.Fatalf("default priority %v, layer %q", b.Priority, r.jobs.record(t, b.ID).Job.Layer)
	}

	// A request a worker has already taken is at position 1, not 0.
	r.queue.mu.Lock()
	r.queue.spot = queue.Spot{}
	r.queue.mu.Unlock()
	if c := r.submit(t, demo, ask("third")); c.Position != 1 || c.Message != progress.QueuedMessage("en", 1, 0) {
		t.Fatalf("taken at once: position %d, %q", c.Position, c.Message)
	}
	// A caller that waits for the answer with no Idempotency-Key (a compat
	// call) takes it in its response: its record need not outlive the end.
	for key, want := range map[string]time.Duration{"": job.EndedEventsTTL, "k-answered": 0} {
		w := ask("waited " + key)
		w.Waited, w.IdempotencyKey = true, key
		if got := r.jobs.record(t, r.submit(t, demo, w).ID).Job.KeepEnded; got != want {
			t.Fatalf("waited with key %q: KeepEnded %s, want %s", key, got, want)
		}
	}
}

// A retry with the same Idempotency-Key gets the first request back, even
// when the tenant's rate limit would refuse a new one; the race where the
// key is found only when storing ends the same way.
func TestSubmitIdempotent(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	tn := demo
	tn.RateLimitRPM = 1
	s := ask("q")
	s.IdempotencyKey = "k1"
	first := r.submit(t, tn, s)
	r.limiter.mu.Lock()
	r.limiter.deny, r.limiter.after = true, time.Minute
	r.limiter.mu.Unlock()
	again := r.submit(t, tn, s)
	if again.ID != first.ID || !again.Existing || first.Existing || again.Status != job.StatusQueued || again.Position != 3 {
		t.Fatalf("retry %+v, first %+v", again, first)
	}
	if calls := r.limiter.calls(); len(calls) != 1 || calls[0] != "demo 1" {
		t.Fatalf("rate limiter asked %v, want once for the first request", calls)
	}
	if enq, _ := r.queue.tasks(); len(enq) != 1 || r.jobs.count() != 1 {
		t.Fatalf("enqueued %v, stored %d: the retry ran twice", enq, r.jobs.count())
	}
	// The limiter is on: another key is refused.
	s.IdempotencyKey = "k2"
	if _, err := r.in.Submit(context.Background(), tn, s); !errors.Is(err, intake.ErrRateLimited) {
		t.Fatalf("new key: %v, want rate limited", err)
	}

	race := newRig(nil)
	race.jobs.hideIdem = true
	s.IdempotencyKey = "k3"
	a, b := race.submit(t, demo, s), race.submit(t, demo, s)
	if b.ID != a.ID || !b.Existing {
		t.Fatalf("key found when storing: %+v, want %s existing", b, a.ID)
	}
	if enq, _ := race.queue.tasks(); len(enq) != 1 {
		t.Fatalf("enqueued %v, want once", enq)
	}
}

// Past its rate limit a tenant gets a RateLimitError with the limiter's
// Retry-After, counted; a tenant without a limit is never asked about.
func TestSubmitRateLimited(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.limiter.deny, r.limiter.after = true, 7*time.Second
	tn := demo
	tn.RateLimitRPM = 30
	_, err := r.in.Submit(context.Background(), tn, ask("q"))
	var rl *intake.RateLimitError
	if !errors.As(err, &rl) || rl.RetryAfter != 7*time.Second || !errors.Is(err, intake.ErrRateLimited) {
		t.Fatalf("err %v, want a RateLimitError after 7s", err)
	}
	if v := value(t, r.metrics.AdmissionRejected.WithLabelValues("normal", metrics.ReasonRateLimited)); v != 1 {
		t.Fatalf("rejected{normal,rate_limited} = %v", v)
	}
	if calls := r.limiter.calls(); len(calls) != 1 || calls[0] != "demo 30" || r.jobs.count() != 0 {
		t.Fatalf("limiter asked %v, stored %d", calls, r.jobs.count())
	}
	if v := value(t, r.metrics.RequestsSubmitted.WithLabelValues("normal")); v != 0 {
		t.Fatalf("a refused request counted as submitted: %v", v)
	}
	r.submit(t, demo, ask("q")) // RateLimitRPM 0: unlimited
	if calls := r.limiter.calls(); len(calls) != 1 {
		t.Fatalf("an unlimited tenant was rate-limited: %v", calls)
	}
}

// A tenant with its share in flight gets a TenantFullError whose
// Retry-After is the time for a tenth of the share to drain at the queue's
// rate (at least a second); a full queue's error passes through. Both are
// counted.
func TestSubmitAdmission(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		max  int
		rate float64
		want time.Duration
	}{{2, 0.25, 4 * time.Second}, {50, 2, 2500 * time.Millisecond}, {50, 0, time.Second}, {2, 100, time.Second}} {
		r := newRig(nil)
		r.queue.rate = tt.rate
		tn := demo
		tn.MaxQueued = tt.max
		for i := range tt.max {
			r.jobs.put(job.Record{Job: job.Job{ID: "live" + string(rune('a'+i)), Tenant: "demo"}, Status: job.StatusRunning})
		}
		_, err := r.in.Submit(context.Background(), tn, ask("q"))
		var tf *intake.TenantFullError
		if !errors.As(err, &tf) || tf.Limit != tt.max || tf.RetryAfter != tt.want {
			t.Errorf("max %d rate %v: err %v, want a TenantFullError after %v", tt.max, tt.rate, err, tt.want)
			continue
		}
		if v := value(t, r.metrics.AdmissionRejected.WithLabelValues("normal", metrics.ReasonTenantFull)); v != 1 {
			t.Errorf("rejected{normal,tenant_full} = %v", v)
		}
		if enq, _ := r.queue.tasks(); len(enq) != 0 || r.jobs.maxLive[0] != tt.max {
			t.Errorf("enqueued %v, limit given %v", enq, r.jobs.maxLive)
		}
	}

	r := newRig(nil)
	r.queue.admitErr = &queue.FullError{Depth: 100, RetryAfter: 3 * time.Second}
	_, err := r.in.Submit(context.Background(), demo, ask("q"))
	var full *queue.FullError
	if !errors.As(err, &full) || full.RetryAfter != 3*time.Second || r.jobs.count() != 0 {
		t.Fatalf("queue full: err %v, stored %d", err, r.jobs.count())
	}
	if v := value(t, r.metrics.AdmissionRejected.WithLabelValues("normal", metrics.ReasonQueueFull)); v != 1 {
		t.Fatalf("rejected{normal,queue_full} = %v", v)
	}
}

// A request stored but not enqueued stands accepted, queued: the orphan
// sweep queues a live record with no task (pkg/maintenance), so ending it
// would fail a request for a moment's outage of the queue's Redis.
func TestSubmitEnqueueFailureLeavesTheRequestToTheSweep(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	r.queue.enqueueErr = errors.New("asynq down")
	a, err := r.in.Submit(context.Background(), demo, ask("q"))
	if err != nil || a.Status != job.StatusQueued {
		t.Fatalf("submit: %+v %v, want accepted and queued", a, err)
	}
	if ends := r.finisher.endings(); len(ends) != 0 {
		t.Fatalf("endings %+v, want none", ends)
	}
	if rec := r.jobs.record(t, a.ID); rec.Status != job.StatusQueued {
		t.Fatalf("stored request left %s, want queued for the sweep", rec.Status)
	}
}

// The answer says service_degraded while the "all" breaker is not closed,
// or those of the route and its fallback both are, with a Retry-After of
// the soonest recovery (at least a second).
func TestSubmitDegraded(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		route    llm.Route
		open     map[string]time.Duration
		degraded bool
		after    time.Duration
	}{
		{"all closed", sonnet, nil, false, 0},
		{"all open", sonnet, map[string]time.Duration{breaker.AllName: 30 * time.Second}, true, 30 * time.Second},
		{"route open, fallback closed", sonnet, map[string]time.Duration{"claude/sonnet": time.Minute}, false, 0},
		{"route and fallback open", sonnet, map[string]time.Duration{"claude/sonnet": 40 * time.Second, "openai/gpt4o": 20 * time.Second}, true, 20 * time.Second},
		{"route open, no fallback", haiku, map[string]time.Duration{"claude/haiku": 10 * time.Second}, true, 10 * time.Second},
		{"recovery due", sonnet, map[string]time.Duration{breaker.AllName: -time.Second}, true, time.Second},
	} {
		r := newRig(nil)
		for name, in := range tt.open {
			r.breakers.open(name, in)
		}
		s := ask("q")
		s.Route = tt.route
		a := r.submit(t, demo, s)
		if a.Degraded != tt.degraded {
			t.Errorf("%s: degraded %v", tt.name, a.Degraded)
			continue
		}
		if !tt.degraded {
			if a.Message != progress.QueuedMessage("en", 3, 5) || a.RetryAfter != 0 {
				t.Errorf("%s: %q, retry after %v", tt.name, a.Message, a.RetryAfter)
			}
			continue
		}
		if a.Message != progress.DegradedMessage("en") || a.RetryAfter > tt.after || a.RetryAfter < tt.after-2*time.Second {
			t.Errorf("%s: %q, retry after %v, want about %v", tt.name, a.Message, a.RetryAfter, tt.after)
		}
		if enq, _ := r.queue.tasks(); len(enq) != 1 || a.Status != job.StatusQueued {
			t.Errorf("%s: a degraded request must be queued all the same: %v %s", tt.name, enq, a.Status)
		}
	}
}

// Cancel ends a request as cancelled and takes its task off the queue; a
// coalesced follower only detaches; an ended request gives ErrEnded and
// touches the queue not at all.
func TestCancel(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	lead := r.submit(t, demo, ask("q"))
	follow := r.submit(t, demo, ask("q"))
	if follow.CoalescedInto != lead.ID {
		t.Fatalf("setup: %+v did not join %s", follow, lead.ID)
	}

	rec := r.jobs.record(t, follow.ID)
	if err := r.in.Cancel(context.Background(), &rec); err != nil {
		t.Fatalf("cancel the follower: %v", err)
	}
	if _, cancelled := r.queue.tasks(); len(cancelled) != 0 {
		t.Fatalf("cancelling a follower removed %v from the queue", cancelled)
	}
	if st := r.jobs.record(t, lead.ID).Status; st != job.StatusQueued {
		t.Fatalf("the leader went %s with its follower", st)
	}

	rec = r.jobs.record(t, lead.ID)
	rec.State.Result = answer("partial")
	if err := r.in.Cancel(context.Background(), &rec); err != nil {
		t.Fatalf("cancel the leader: %v", err)
	}
	_, cancelled := r.queue.tasks()
	if len(cancelled) != 1 || cancelled[0] != (task{lead.ID, priority.Normal}) {
		t.Fatalf("queue cancels %v, want %s at normal", cancelled, lead.ID)
	}
	ends := r.finisher.endings()
	if len(ends) != 2 || ends[1].id != lead.ID || ends[1].e.Status != job.StatusCancelled ||
		ends[1].e.Code != job.CodeCancelled || ends[1].e.State.Result != nil {
		t.Fatalf("endings %+v, want the leader cancelled without a result", ends)
	}

	rec = r.jobs.record(t, lead.ID)
	if err := r.in.Cancel(context.Background(), &rec); !errors.Is(err, finish.ErrEnded) {
		t.Fatalf("cancel again: %v, want ErrEnded", err)
	}
	if _, cancelled := r.queue.tasks(); len(cancelled) != 1 {
		t.Fatalf("an ended request's task cancelled again: %v", cancelled)
	}
}

// Each route has its own max_tokens limit: up to it a request is
// accepted, above it refused with an OutputLimitError naming both
// numbers; a request without max_tokens gets the default, and when it
// asks for the model's maximum (OpenAI's Chat Completions) is marked so
// (llm.Request.MaxTokensDefault) and metered at the default; the
// operator's ceiling lowers every route.
func TestSubmitOutputLimits(t *testing.T) {
	t.Parallel()
	limits := func(ceiling int) func(*intake.Config) {
		return func(c *intake.Config) {
			c.OutputLimits = map[llm.Route]int{sonnet: 64_000, gpt4o: 16_384}
			c.MaxTokensLimit = ceiling
		}
	}
	for _, tt := range []struct {
		name     string
		ceiling  int
		route    llm.Route
		asked    int
		modelMax bool
		want     int // stored max_tokens; 0: refused
		limit    int // the refusal's limit
	}{
		{"sonnet at its limit", 0, sonnet, 64_000, false, 64_000, 0},
		{"sonnet above it", 0, sonnet, 64_001, false, 0, 64_000},
		{"gpt-4o above its own", 0, gpt4o, 16_385, false, 0, 16_384},
		{"a route without a limit of its own", 0, haiku, intake.OutputLimitDefault + 1, false, 0, intake.OutputLimitDefault},
		{"none asked: the default", 0, sonnet, 0, false, 1024, 0},
		{"none asked: the model's maximum, metered at the default", 0, gpt4o, 0, true, 1024, 0},
		{"under the operator's ceiling", 32_000, sonnet, 32_001, false, 0, 32_000},
		{"the model's maximum, metered at the default under the ceiling", 1000, sonnet, 0, true, 1000, 0},
	} {
		r := newRig(limits(tt.ceiling))
		s := ask("q")
		s.Route, s.Request.MaxTokens, s.ModelMaxTokens = tt.route, tt.asked, tt.modelMax
		a, err := r.in.Submit(context.Background(), demo, s)
		if tt.want == 0 {
			ole, ok := errors.AsType[*intake.OutputLimitError](err)
			if !ok || !errors.Is(err, intake.ErrInput) || ole.Asked != tt.asked || ole.Limit != tt.limit || ole.Route != tt.route {
				t.Errorf("%s: err %v, want an OutputLimitError %d > %d", tt.name, err, tt.asked, tt.limit)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		req := r.jobs.record(t, a.ID).Job.Request
		if req.MaxTokens != tt.want || req.MaxTokensDefault != tt.modelMax {
			t.Errorf("%s: stored max_tokens %d (default %v), want %d (%v)", tt.name, req.MaxTokens, req.MaxTokensDefault, tt.want, tt.modelMax)
		}
	}
}

// InputTokens validates like Submit and estimates the prompt as the key
// pool does, storing and enqueueing nothing.
func TestInputTokens(t *testing.T) {
	t.Parallel()
	r := newRig(nil)
	s := ask(strings.Repeat("word ", 40)) // 200 bytes: 50 tokens
	s.Request.System = "be brief"         // 8 bytes: 2 tokens
	n, err := r.in.InputTokens(s)
	if err != nil || n != 52 {
		t.Fatalf("InputTokens = %d, %v; want 52", n, err)
	}
	bad := ask("q")
	bad.Request.Messages[0].Role = "system"
	if _, err := r.in.InputTokens(bad); !errors.Is(err, intake.ErrInput) {
		t.Errorf("a bad role: %v, want an input error", err)
	}
	if enq, _ := r.queue.tasks(); r.jobs.count() != 0 || len(enq) != 0 {
		t.Errorf("stored %d, enqueued %d", r.jobs.count(), len(enq))
	}
}
