package dispatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/slots"
)

func exhausted(reason string, after time.Duration) error {
	return &keypool.ExhaustedError{RetryAfter: after, Reason: reason}
}

// Every route without capacity for longer than HoldWait: the request goes
// back to asynq with a delay reaching the first whole second after the
// capacity returns, which asynq does not count as a failure; it is marked
// waiting, nothing is called, and its slot is given back.
func TestUnitExhaustedReEnqueues(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.pool.script[sonnet] = []error{exhausted(keypool.ReasonCooling, 30*time.Second)}
	h.pool.script[gpt4o] = []error{exhausted(keypool.ReasonCooling, 40*time.Second)}
	rec := h.submit(nil)
	before := time.Now()
	err := h.process(t.Context(), rec.Job.ID)
	if err == nil || IsFailure(err) {
		t.Fatalf("ProcessTask = %v, want a wait that is not a failure", err)
	}
	if d := RetryDelay(0, err, nil); d < 29*time.Second || d > 31*time.Second {
		t.Fatalf("retry delay %s, want the earliest route's 30s up to the next whole second", d)
	}
	got := h.jobs.record(rec.Job.ID)
	if got.Status != job.StatusWaiting || got.State.RetryAt.Before(before.Add(30*time.Second)) || got.State.RetryAt.Nanosecond() != 0 {
		t.Fatalf("record %s, retry at %s: want waiting until a whole second after 30s", got.Status, got.State.RetryAt)
	}
	waiting := h.jobs.eventsOf(rec.Job.ID, job.EventWaiting)
	if len(waiting) != 1 || waiting[0].RetryAfterSeconds < 30 || waiting[0].RetryAfterSeconds > 31 {
		t.Fatalf("waiting events %+v", waiting)
	}
	if len(h.fin.endings()) != 0 || len(h.claude.callList())+len(h.openai.callList()) != 0 {
		t.Fatal("an exhausted request was ended or called")
	}
	// Cooling keys are our own pacing, not the providers refusing: the
	// "all" breaker does not count it.
	if n := h.breakers.failures(t, breaker.AllName); n != 0 {
		t.Fatalf("the all breaker counts %d failures for cooling keys", n)
	}
	h.noSlotHeld()
}

// When every route refuses (all keys disabled), the "all" breaker counts a
// failure.
func TestUnitEveryRouteRefusingChargesAllBreaker(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.pool.script[sonnet] = []error{exhausted(keypool.ReasonDisabled, 20*time.Second)}
	h.pool.script[gpt4o] = []error{exhausted(keypool.ReasonDisabled, 20*time.Second)}
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); IsFailure(err) {
		t.Fatalf("ProcessTask = %v, want a wait", err)
	}
	if n := h.breakers.failures(t, breaker.AllName); n != 1 {
		t.Fatalf("the all breaker counts %d failures, want 1", n)
	}
}

// An open "all" breaker is re-checked within a few seconds, not after its
// whole cooldown, and no route is tried meanwhile.
func TestUnitOpenAllBreakerRechecksSoon(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.HoldWait = time.Second })
	h.breakers.open[breaker.AllName] = &breaker.OpenError{Name: breaker.AllName, State: breaker.StateOpen, RetryAfter: time.Minute}
	rec := h.submit(nil)
	err := h.process(t.Context(), rec.Job.ID)
	if d := RetryDelay(0, err, nil); IsFailure(err) || d > allRecheck+time.Second {
		t.Fatalf("ProcessTask = %v (delay %s), want a wait of at most %s", err, d, allRecheck+time.Second)
	}
	if h.pool.asked(sonnet)+h.pool.asked(gpt4o) != 0 {
		t.Fatal("a route was tried behind an open all breaker")
	}
}

// A wait that would end past the request's deadline fails it now, with a
// reason, whether it would be held in the worker or re-enqueued.
func TestUnitWaitPastDeadlineFails(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after time.Duration
		says  string
	}{
		{"re-enqueue", 30 * time.Second, "stays exhausted"},
		{"hold", 5 * time.Second, "no provider route has capacity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.pool.script[gpt4o] = []error{exhausted(keypool.ReasonCooling, tc.after)}
			rec := h.submit(func(r *job.Record) { r.Job.Route, r.Job.Deadline = gpt4o, time.Now().Add(2*time.Second) })
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatalf("ProcessTask = %v", err)
			}
			if end := h.only(); end.Code != job.CodeDeadline || !strings.Contains(end.Reason, tc.says) {
				t.Fatalf("ending %+v, want deadline_exceeded saying %q", end, tc.says)
			}
			h.noSlotHeld()
		})
	}
}

// A short wait (under HoldWait) is held in the worker without the slot:
// the request is marked waiting with no slot held, then takes a slot again
// and completes on its second attempt, without a trip through asynq.
func TestUnitShortWaitHoldsWithoutSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.pool.script[gpt4o] = []error{exhausted(keypool.ReasonCooling, 150*time.Millisecond)}
	rec := h.submit(func(r *job.Record) { r.Job.Route = gpt4o })
	heldWhileWaiting := -1
	h.jobs.onApply = func(_ string, c job.Change) error {
		if c.Status == job.StatusWaiting {
			heldWhileWaiting = h.slots.inUse(t)
		}
		return nil
	}
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v, want the request completed in the worker", err)
	}
	if heldWhileWaiting != 0 {
		t.Fatalf("%d slots held while the request waited", heldWhileWaiting)
	}
	if h.slots.asks() != 2 || h.starts.count() != 1 {
		t.Fatalf("slot asks %d, starts %d; want 2 asks and one start", h.slots.asks(), h.starts.count())
	}
	end := h.only()
	if end.Status != job.StatusCompleted || end.State.Attempts != 2 {
		t.Fatalf("ending %+v, want completed on the second attempt", end)
	}
	if w := h.jobs.eventsOf(rec.Job.ID, job.EventWaiting); len(w) != 1 || w[0].RetryAfterSeconds != 1 {
		t.Fatalf("waiting events %+v", w)
	}
	h.noSlotHeld()
}

// A key whose bucket refills within PaceWait is waited for with the slot
// held: no waiting status, one slot ask. Each bucket counts, Anthropic's
// input and output token buckets too.
func TestUnitPaceWaitKeepsSlot(t *testing.T) {
	t.Parallel()
	for _, reason := range []string{keypool.ReasonRequests, keypool.ReasonTokens, keypool.ReasonInputTokens, keypool.ReasonOutputTokens} {
		t.Run(reason, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, nil)
			h.pool.script[gpt4o] = []error{exhausted(reason, 60*time.Millisecond)}
			rec := h.submit(func(r *job.Record) { r.Job.Route = gpt4o })
			if err := h.process(t.Context(), rec.Job.ID); err != nil {
				t.Fatal(err)
			}
			if h.slots.asks() != 1 || len(h.jobs.eventsOf(rec.Job.ID, job.EventWaiting)) != 0 || h.pool.asked(gpt4o) != 2 {
				t.Fatalf("slot asks %d, waiting events %d, acquires %d; want the key waited for with the slot",
					h.slots.asks(), len(h.jobs.eventsOf(rec.Job.ID, job.EventWaiting)), h.pool.asked(gpt4o))
			}
			if h.only().Status != job.StatusCompleted {
				t.Fatal("not completed")
			}
		})
	}
}

// A lease reserved ahead (NotBefore after GrantedAt) is called no earlier
// than its turn.
func TestUnitReservedLeaseWaitsItsTurn(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.pool.delay = 80 * time.Millisecond
	var calledAt time.Time
	h.claude.then(func(context.Context) (*llm.Result, error) { calledAt = time.Now(); return answer("ok"), nil })
	rec := h.submit(nil)
	start := time.Now()
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if calledAt.Sub(start) < 80*time.Millisecond {
		t.Fatalf("called %s after the start, before the reservation's turn", calledAt.Sub(start))
	}
}

// No slot before the deadline: the request fails deadline_exceeded.
func TestUnitSlotWaitPastDeadline(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	for i := range 4 { // every slot taken by others
		s, err := h.slots.lim.Acquire(t.Context(), priority.Critical, slots.Waiter{ID: "other-" + string(rune('a'+i)), Since: time.Now()})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Release(context.Background())
	}
	rec := h.submit(func(r *job.Record) { r.Job.Deadline = time.Now().Add(300 * time.Millisecond) })
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatal(err)
	}
	if end := h.only(); end.Code != job.CodeDeadline || !strings.Contains(end.Reason, "free provider slot") {
		t.Fatalf("ending %+v", end)
	}
	if len(h.claude.callList()) != 0 {
		t.Fatal("called without a slot")
	}
}

// A task cancelled mid-call (the caller's DELETE, or shutdown) releases
// its key without blaming it, gives its slot back, and ends nothing: the
// API recorded the cancellation, or asynq re-queues on shutdown.
func TestUnitCancelledCallReleasesKeyAndSlot(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.claude.then(func(ctx context.Context) (*llm.Result, error) {
		<-ctx.Done()
		return nil, &llm.Error{Class: llm.ClassTransient, Err: ctx.Err()}
	})
	rec := h.submit(nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.process(ctx, rec.Job.ID) }()
	<-h.claude.called
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	if got := h.pool.settled(); !slices.Equal(got, []string{"release sonnet-1"}) {
		t.Fatalf("key settlements %v, want the lease released, not failed", got)
	}
	if len(h.fin.endings()) != 0 || len(h.openai.callList()) != 0 || h.breakers.failures(t, sonnet.String()) != 0 {
		t.Fatal("a cancelled call ended the request, fell back or counted for the breaker")
	}
	h.noSlotHeld()
}

// A panic in a call still gives the slot back and leaves the priority's
// admission count as it was.
func TestUnitPanicReleasesSlotAndAdmission(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxActive = map[priority.Priority]int{priority.Normal: 1} })
	h.claude.then(func(context.Context) (*llm.Result, error) { panic("adapter bug") })
	rec := h.submit(nil)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller (asynq recovers it)")
			}
		}()
		_ = h.process(t.Context(), rec.Job.ID)
	}()
	h.noSlotHeld()
	if got := h.pool.settled(); len(got) != 1 || !strings.HasPrefix(got[0], "release ") {
		t.Fatalf("key settlements after the panic: %v, want the lease released", got)
	}
	next := h.submit(nil)
	if err := h.process(t.Context(), next.Job.ID); err != nil {
		t.Fatalf("the next task after a panic: %v, want admitted and completed", err)
	}
}

// Beyond MaxActive tasks of one priority, a task goes straight back to
// its queue for about SlotBusyDelay, without a failure, a status change or
// a slot; other priorities are not held back.
func TestUnitMaxActiveTurnsAway(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) {
		c.MaxActive = map[priority.Priority]int{priority.Normal: 1}
		c.SlotBusyDelay = 200 * time.Millisecond
	})
	release := make(chan struct{})
	h.claude.then(func(context.Context) (*llm.Result, error) { <-release; return answer("first"), nil })
	first := h.submit(nil)
	done := make(chan error, 1)
	go func() { done <- h.process(t.Context(), first.Job.ID) }()
	<-h.claude.called

	second := h.submit(nil)
	err := h.process(t.Context(), second.Job.ID)
	var w *waitError
	if !errors.As(err, &w) || IsFailure(err) || w.Delay < 100*time.Millisecond || w.Delay > 300*time.Millisecond {
		t.Fatalf("over the cap: %v, want a wait of 100ms-300ms that is not a failure", err)
	}
	if len(h.jobs.events(second.Job.ID)) != 0 || h.slots.asks() != 1 {
		t.Fatal("a task turned away changed its record or asked for a slot")
	}
	urgent := h.submit(func(r *job.Record) { r.Job.Priority = priority.High })
	if err := h.process(t.Context(), urgent.Job.ID); err != nil {
		t.Fatalf("a HIGH task while NORMAL is at its cap: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A failed write of the answer (Redis restarting) is retried in the
// worker: the paid-for answer is recorded without calling the provider
// again.
func TestUnitAnswerKeptThroughFinishHiccup(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	h.fin.errs = []error{errors.New("LOADING Redis is loading the dataset in memory")}
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v", err)
	}
	if n := len(h.claude.callList()); n != 1 {
		t.Fatalf("%d provider calls, want 1", n)
	}
	if n := len(h.fin.endings()); n != 2 || h.jobs.record(rec.Job.ID).Status != job.StatusCompleted {
		t.Fatalf("Finish called %d times, status %s; want 2 and completed", n, h.jobs.record(rec.Job.ID).Status)
	}
}

// A route failing transiently while the other is exhausted: the request
// waits for capacity (no failure, no asynq retry counted) but only about
// a second, the transient route's re-check, held in the worker; it then
// completes.
func TestUnitTransientAndExhaustedWaitsBriefly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxKeyTries = 1 })
	h.pool.script[sonnet] = []error{exhausted(keypool.ReasonCooling, 30*time.Second)}
	h.openai.then(failWith(llm.ClassTransient))
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v, want the request held about 1s and completed", err)
	}
	if w := h.jobs.eventsOf(rec.Job.ID, job.EventWaiting); len(w) != 1 || w[0].RetryAfterSeconds != 1 {
		t.Fatalf("waiting events %+v, want one of 1s", w)
	}
	if end := h.only(); end.Status != job.StatusCompleted || end.State.Attempts != 2 {
		t.Fatalf("ending %+v", end)
	}
}

// The same two failures in the other order: the asked route fails
// transiently, the fallback is exhausted for 30 s. The wait is still the
// soonest (1 s), not the last route's.
func TestUnitTransientThenExhaustedWaitsBriefly(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *Config) { c.MaxKeyTries = 1 })
	h.claude.then(failWith(llm.ClassTransient))
	h.pool.script[gpt4o] = []error{exhausted(keypool.ReasonCooling, 30*time.Second)}
	rec := h.submit(nil)
	if err := h.process(t.Context(), rec.Job.ID); err != nil {
		t.Fatalf("ProcessTask = %v, want the request held about 1s and completed", err)
	}
	if w := h.jobs.eventsOf(rec.Job.ID, job.EventWaiting); len(w) != 1 || w[0].RetryAfterSeconds != 1 {
		t.Fatalf("waiting events %+v, want one of 1s", w)
	}
	if end := h.only(); end.Status != job.StatusCompleted || end.State.Attempts != 2 {
		t.Fatalf("ending %+v", end)
	}
}
