package dispatch

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
)

// The plain path: one slot, one key, one call; the request is completed
// with the answer (which the finisher caches), the key is settled as a
// success, and nothing is left held.
func TestUnitSuccess(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	end := h.only()
	st := end.State
	if end.Status != job.StatusCompleted || st.ServedRoute == nil || *st.ServedRoute != sonnet || st.KeyID != "sonnet-1" ||
		st.Result == nil || st.Result.Text() != "ok" || st.Cached != "none" || st.Attempts != 1 || st.StartedAt.IsZero() {
		t.Fatalf("ending %+v", end)
	}
	if got := h.claude.callList(); !slices.Equal(got, []string{"sk-sonnet-1 model-sonnet"}) {
		t.Fatalf("calls %v, want one with the lease's key and the tier's model", got)
	}
	if got := h.trail.list(); !slices.Equal(got, []string{"finish completed"}) {
		t.Fatalf("trail %v", got)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"success sonnet-1"}) {
		t.Fatalf("key settlements %v", got)
	}
	started := h.jobs.eventsOf(rec.Job.ID, job.EventStarted)
	if len(started) != 1 || started[0].Attempt != 1 || started[0].Provider != llm.ProviderClaude {
		t.Fatalf("started events %+v", started)
	}
	if h.starts.count() != 1 {
		t.Fatalf("RecordStart called %d times, want once", h.starts.count())
	}
	if len(h.openai.callList()) != 0 {
		t.Fatal("the fallback was called although the route answered")
	}
	h.noSlotHeld()
}

// A request run again (a re-check after waiting) keeps its first start
// time and does not count as a new dequeue for the drain rate.
func TestUnitRecheckIsNotANewStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(func(r *job.Record) {
		r.Status = job.StatusWaiting
		r.State.Attempts = 2
		r.State.StartedAt = r.Job.CreatedAt
	})
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if h.starts.count() != 0 {
		t.Fatal("a re-check was recorded as a new start")
	}
	st := h.only().State
	if st.Attempts != 3 || !st.StartedAt.Equal(rec.Job.CreatedAt) {
		t.Fatalf("attempts %d, started %s; want 3 and the first start kept", st.Attempts, st.StartedAt)
	}
}

// A 429 cools that key and the next key of the same route answers; a
// first 429 is not held against the route's breaker.
func TestUnitRateLimitCoolsKeyAndTriesNext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.claude.then(failWith(llm.ClassRateLimited))
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"cool sonnet-1", "success sonnet-2"}) {
		t.Fatalf("key settlements %v, want the first key cooled and the second settled", got)
	}
	if end := h.only(); end.Status != job.StatusCompleted || end.State.KeyID != "sonnet-2" || *end.State.ServedRoute != sonnet {
		t.Fatalf("ending %+v", end)
	}
	if len(h.openai.callList()) != 0 {
		t.Fatal("a 429 on one key sent the request to the other provider")
	}
	retrying := h.jobs.eventsOf(rec.Job.ID, job.EventRetrying)
	if len(retrying) != 1 || retrying[0].Error != "rate limited" {
		t.Fatalf("retrying events %+v", retrying)
	}
	if n := h.breakers.failures(t, sonnet.String()); n != 0 {
		t.Fatalf("route breaker counts %d failures after a first 429", n)
	}
}

// Quota and auth failures disable the key, alert the operators, and the
// next key answers.
func TestUnitQuotaDisablesKeyAndAlerts(t *testing.T) {
	t.Parallel()
	for _, class := range []llm.Class{llm.ClassQuota, llm.ClassAuth} {
		t.Run(string(class), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.claude.then(failWith(class))
			rec := h.submit(nil)
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatal(err)
			}
			if got := h.pool.settled(); !slices.Equal(got, []string{"disable sonnet-1", "success sonnet-2"}) {
				t.Fatalf("key settlements %v", got)
			}
			if !slices.Equal(h.alerts.alerts, []string{"sonnet-1 claude/sonnet " + string(class)}) {
				t.Fatalf("alerts %v", h.alerts.alerts)
			}
			if h.only().Status != job.StatusCompleted {
				t.Fatal("not completed by the next key")
			}
		})
	}
}

// Overload and a missing model leave the route at once for the other
// provider: no other key of the route is tried, the route's breaker counts
// a failure, the key is refunded (not cooled), and the caller sees a
// fallback event.
func TestUnitOverloadFallsBack(t *testing.T) {
	t.Parallel()
	for _, class := range []llm.Class{llm.ClassOverloaded, llm.ClassModelUnavailable} {
		t.Run(string(class), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.claude.then(failWith(class))
			rec := h.submit(nil)
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatal(err)
			}
			if n := len(h.claude.callList()); n != 1 {
				t.Fatalf("%d calls on the refusing route, want 1", n)
			}
			if got := h.pool.settled(); !slices.Equal(got, []string{"refund sonnet-1", "success gpt4o-1"}) {
				t.Fatalf("key settlements %v", got)
			}
			if n := h.breakers.failures(t, sonnet.String()); n != 1 {
				t.Fatalf("route breaker counts %d failures, want 1", n)
			}
			end := h.only()
			if end.Status != job.StatusCompleted || *end.State.ServedRoute != gpt4o {
				t.Fatalf("ending %+v, want served by the fallback", end)
			}
			fb := h.jobs.eventsOf(rec.Job.ID, job.EventFallback)
			if len(fb) != 1 || fb[0].From != "claude/sonnet" || fb[0].Provider != llm.ProviderOpenAI || fb[0].Tier != "gpt4o" {
				t.Fatalf("fallback events %+v", fb)
			}
			if got := h.openai.callList(); !slices.Equal(got, []string{"sk-gpt4o-1 model-gpt4o"}) {
				t.Fatalf("fallback calls %v, want the fallback tier's model", got)
			}
		})
	}
}

// A request whose max_tokens the fallback's model does not give is sent
// there with the model's maximum, and its ending says so; on its own
// route (whose limit intake checked) it goes as asked.
func TestUnitFallbackClampsMaxTokens(t *testing.T) {
	t.Parallel()
	limits := func(c *Config) {
		c.OutputLimit = func(r llm.Route) int { return map[llm.Route]int{sonnet: 64_000, gpt4o: 16_384}[r] }
	}
	for _, tt := range []struct {
		name           string
		claudeFails    bool
		claude, openai []int
		clamped        *job.Clamp
	}{
		{"own route", false, []int{64_000}, nil, nil},
		{"fallback", true, []int{64_000}, []int{16_384}, &job.Clamp{From: 64_000, To: 16_384}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, limits)
			if tt.claudeFails {
				h.claude.then(failWith(llm.ClassOverloaded))
			}
			rec := h.submit(func(r *job.Record) { r.Job.Request.MaxTokens = 64_000 })
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatal(err)
			}
			if got := h.claude.maxTokensSent(); !slices.Equal(got, tt.claude) {
				t.Errorf("claude sent max_tokens %v, want %v", got, tt.claude)
			}
			if got := h.openai.maxTokensSent(); !slices.Equal(got, tt.openai) {
				t.Errorf("openai sent max_tokens %v, want %v", got, tt.openai)
			}
			end := h.only()
			if end.Status != job.StatusCompleted || !reflect.DeepEqual(end.State.MaxTokensClamped, tt.clamped) {
				t.Fatalf("ending %s, clamped %+v; want completed, %+v", end.Status, end.State.MaxTokensClamped, tt.clamped)
			}
			if got := h.jobs.record(rec.Job.ID).Job.Request.MaxTokens; got != 64_000 {
				t.Errorf("the stored request now asks %d max_tokens, want the caller's 64000", got)
			}
		})
	}
}

// A route whose breaker is open is not called at all; the fallback
// answers.
func TestUnitOpenBreakerSkipsRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.breakers.open[sonnet.String()] = &breaker.OpenError{Name: sonnet.String(), State: breaker.StateOpen, RetryAfter: 30 * time.Second}
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if len(h.claude.callList()) != 0 || h.pool.asked(sonnet) != 0 {
		t.Fatal("a route with an open breaker was used")
	}
	if end := h.only(); end.Status != job.StatusCompleted || *end.State.ServedRoute != gpt4o {
		t.Fatalf("ending %+v", end)
	}
}

// A 5xx is retried on another key of the same route after a short
// backoff, and never counts for the breaker.
func TestUnitTransientTriesAnotherKey(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.claude.then(failWith(llm.ClassTransient))
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"refund sonnet-1", "success sonnet-2"}) {
		t.Fatalf("key settlements %v", got)
	}
	if len(h.openai.callList()) != 0 {
		t.Fatal("one 5xx sent the request to the other provider")
	}
	if n := h.breakers.failures(t, sonnet.String()); n != 0 {
		t.Fatalf("a 5xx counted %d breaker failures", n)
	}
	if end := h.only(); end.Status != job.StatusCompleted || end.State.KeyID != "sonnet-2" {
		t.Fatalf("ending %+v", end)
	}
}

// Transient failures on every key of every route, with no asynq retry
// left (outside asynq the task has none), fail the request as
// provider_unavailable after MaxKeyTries calls per route.
func TestUnitTransientOutlastingRetriesFails(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxKeyTries = 2 })
	for range 2 {
		h.claude.then(failWith(llm.ClassTransient))
		h.openai.then(failWith(llm.ClassTransient))
	}
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v, want nil once the request failed", err)
	}
	if a, b := len(h.claude.callList()), len(h.openai.callList()); a != 2 || b != 2 {
		t.Fatalf("calls %d + %d, want MaxKeyTries (2) per route", a, b)
	}
	end := h.only()
	if end.Status != job.StatusFailed || end.Code != job.CodeProviderUnavailable {
		t.Fatalf("ending %+v, want failed provider_unavailable", end)
	}
	h.noSlotHeld()
}

// A permanent error (the request's own fault) fails the request at once:
// one call, no other key, no fallback, no breaker failure, and no error
// for asynq to retry.
func TestUnitPermanentFailsAtOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.claude.then(failWith(llm.ClassPermanent))
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v, want nil (no retry)", err)
	}
	if len(h.claude.callList()) != 1 || len(h.openai.callList()) != 0 {
		t.Fatalf("calls %v / %v, want one call only", h.claude.callList(), h.openai.callList())
	}
	end := h.only()
	if end.Status != job.StatusFailed || end.Code != job.CodeProviderError || !strings.Contains(end.Reason, "provider detail 7f3a") {
		t.Fatalf("ending %+v, want provider_error with the provider's detail for the operators", end)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"refund sonnet-1"}) {
		t.Fatalf("key settlements %v", got)
	}
	if h.breakers.failures(t, sonnet.String()) != 0 {
		t.Fatal("a permanent error was charged to the breaker")
	}
	for _, ev := range h.jobs.events(rec.Job.ID) {
		if strings.Contains(ev.Error, "7f3a") {
			t.Fatalf("the provider's text reached an event: %+v", ev)
		}
	}
	h.noSlotHeld()
}

// No key configured for the route or its fallback fails no_route; a
// prompt larger than every key's TPM fails provider_error.
func TestUnitNoKeys(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		code job.Code
	}{
		{keypool.ErrUnknownRoute, job.CodeNoRoute},
		{keypool.ErrTooLarge, job.CodeProviderError},
	} {
		t.Run(string(tc.code), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.pool.script[sonnet] = []error{tc.err}
			h.pool.script[gpt4o] = []error{tc.err}
			rec := h.submit(nil)
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatal(err)
			}
			if end := h.only(); end.Status != job.StatusFailed || end.Code != tc.code {
				t.Fatalf("ending %+v, want failed %s", end, tc.code)
			}
			if len(h.claude.callList())+len(h.openai.callList()) != 0 {
				t.Fatal("a provider was called without a lease")
			}
		})
	}
}

// A request already ended (cancelled) or gone is dropped without a slot,
// a call or a write; a payload that is not ours is refused for good.
func TestUnitEndedOrUnknownRequestIsDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(func(r *job.Record) { r.Status = job.StatusCancelled })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.process(t.Context(), "req-unknown"); err != nil {
		t.Fatal(err)
	}
	if h.slots.asks() != 0 || len(h.claude.callList()) != 0 || len(h.jobs.events(rec.Job.ID)) != 0 || len(h.fin.endings()) != 0 {
		t.Fatal("an ended or unknown request was worked on")
	}
	err := h.d.ProcessTask(t.Context(), asynq.NewTask("bulwark:call", []byte("{")))
	if !errors.Is(err, asynq.SkipRetry) {
		t.Fatalf("bad payload: %v, want SkipRetry", err)
	}
	// A Redis error reading the record is returned, for asynq to retry.
	h.jobs.getErr = errors.New("LOADING")
	if err := h.process(t.Context(), rec.Job.ID); err == nil {
		t.Fatal("a failed read of the record was swallowed")
	}
}

// A request cancelled while it waited for its slot is not called: the
// running mark is refused, the slot is given back.
func TestUnitCancelledWhileWaitingForSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(nil)
	h.jobs.onApply = func(id string, c job.Change) error {
		if c.Status == job.StatusRunning {
			h.jobs.setStatus(id, job.StatusCancelled) // the caller's DELETE wins the race
		}
		return nil
	}
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if h.slots.asks() != 1 || len(h.claude.callList()) != 0 || len(h.fin.endings()) != 0 {
		t.Fatalf("slot asks %d, calls %v, endings %v", h.slots.asks(), h.claude.callList(), h.fin.endings())
	}
	h.noSlotHeld()
}

// A request past its deadline before it starts fails at once, without a
// slot.
func TestUnitDeadlineBeforeStart(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(func(r *job.Record) { r.Job.Deadline = r.Job.CreatedAt.Add(-1) })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	end := h.only()
	if end.Code != job.CodeDeadline || !strings.Contains(end.Reason, "before it could start") || h.slots.asks() != 0 {
		t.Fatalf("ending %+v, slot asks %d", end, h.slots.asks())
	}
}

// A slot script that timed out (the Redis master of the slots down) wraps
// context.DeadlineExceeded like the request's own deadline would: it is
// an error for asynq to retry, not the request's deadline.
func TestUnitRedisTimeoutIsNotTheDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(nil)
	h.slots.mu.Lock()
	h.slots.err = fmt.Errorf("slots: acquire a normal slot: %w", context.DeadlineExceeded)
	h.slots.mu.Unlock()
	if err := h.process(t.Context(), rec.Job.ID); err == nil {
		t.Fatal("no error for asynq to retry")
	}
	if ends := h.fin.endings(); len(ends) != 0 {
		t.Fatalf("endings %+v, want none: the request is minutes from its deadline", ends)
	}
}

// Finish refusing because someone else ended the request first is not an
// error, and the answer is not recorded twice.
func TestUnitCompletionAfterCancel(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	rec := h.submit(nil)
	h.claude.then(func(context.Context) (*llm.Result, error) {
		h.jobs.setStatus(rec.Job.ID, job.StatusCancelled) // cancelled while the call ran
		return answer("late"), nil
	})
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	if n := len(h.fin.endings()); n != 1 {
		t.Fatalf("Finish called %d times, want 1", n)
	}
	if h.jobs.record(rec.Job.ID).Status != job.StatusCancelled {
		t.Fatal("the cancellation was overwritten")
	}
}

// A request that asked for its model's limit (no max_tokens, OpenAI's
// way) is metered at the default and sent to Anthropic with the model's
// limit, which Anthropic requires; OpenAI gets no max_tokens at all
// (pkg/provider/openai, TestEncodeRequestWithoutMaxTokens).
func TestUnitDefaultMaxTokensPerProvider(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) {
		c.OutputLimit = func(r llm.Route) int { return map[llm.Route]int{sonnet: 64_000, gpt4o: 16_384}[r] }
	})
	h.claude.then(failWith(llm.ClassOverloaded))
	rec := h.submit(func(r *job.Record) { r.Job.Request.MaxTokens, r.Job.Request.MaxTokensDefault = 1024, true })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if got := h.claude.maxTokensSent(); !slices.Equal(got, []int{64_000}) {
		t.Errorf("claude sent max_tokens %v, want its model's 64000", got)
	}
	if got := h.openai.maxTokensSent(); !slices.Equal(got, []int{1024}) {
		t.Errorf("openai was given max_tokens %v, want the 1024 estimate (its encoder sends none)", got)
	}
	if end := h.only(); end.Status != job.StatusCompleted || end.State.MaxTokensClamped != nil {
		t.Fatalf("ending %s, clamped %+v; want completed, not clamped", end.Status, end.State.MaxTokensClamped)
	}
}
