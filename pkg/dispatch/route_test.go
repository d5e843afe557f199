package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"bulwark/pkg/breaker"
	"bulwark/pkg/job"
	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
)

// TestConsequences pins what each failure class does. A change here is a
// change of behaviour an operator will notice: write it down in the
// package doc too.
func TestConsequences(t *testing.T) {
	t.Parallel()
	tests := []struct {
		class     llm.Class
		breaker   breaker.Outcome
		againOnly bool
		key       keypool.Action
		next      step
		event     bool
	}{
		// A 429 is about the key: cool it, try the next. It counts for the
		// route's breaker only on a key already cooled once (againOnly);
		// three in a row open it.
		{llm.ClassRateLimited, breaker.Failure, true, keypool.Cool, nextKey, true},
		// Billing and credentials condemn one key, not the route.
		{llm.ClassQuota, breaker.Ignore, false, keypool.Disable, nextKey, true},
		{llm.ClassAuth, breaker.Ignore, false, keypool.Disable, nextKey, true},
		// Overload and a missing model condemn the provider's route for
		// this attempt: the other provider answers.
		{llm.ClassOverloaded, breaker.Failure, false, keypool.Refund, nextRoute, true},
		{llm.ClassModelUnavailable, breaker.Failure, false, keypool.Refund, nextRoute, true},
		// 5xx and timeouts are noise: back off, another key; never a breaker.
		{llm.ClassTransient, breaker.Ignore, false, keypool.Refund, nextKeyBackoff, true},
		// The request's own fault ends it, silently for the breaker.
		{llm.ClassPermanent, breaker.Ignore, false, keypool.Refund, failRequest, false},
	}
	if len(tests) != len(llm.Classes) {
		t.Fatalf("%d classes tested, llm has %d: add the new class here and to consequences", len(tests), len(llm.Classes))
	}
	for _, tt := range tests {
		t.Run(string(tt.class), func(t *testing.T) {
			t.Parallel()
			c := consequenceOf(fmt.Errorf("call: %w", &llm.Error{Class: tt.class}))
			if c.breaker != tt.breaker || c.againOnly != tt.againOnly || c.key != tt.key || c.next != tt.next || (c.event != "") != tt.event {
				t.Fatalf("consequence = %+v, want breaker %s (again only %v), key %s, next %d, event %v",
					c, tt.breaker, tt.againOnly, tt.key, tt.next, tt.event)
			}
		})
	}
}

// An error that is not a classified provider error (a transport failure)
// is handled as transient, never as the request's fault.
func TestUnclassifiedIsTransient(t *testing.T) {
	t.Parallel()
	for _, err := range []error{errors.New("connection reset"), context.DeadlineExceeded} {
		if c := consequenceOf(err); c != consequences[llm.ClassTransient] {
			t.Fatalf("consequenceOf(%v) = %+v, want the transient row", err, c)
		}
	}
}

// halfOpen is a Breakers whose every breaker is half-open with its probe
// out for as long as the longest call.
type halfOpen struct{}

func (halfOpen) Allow(_ context.Context, name string) (*breaker.Permit, error) {
	return nil, &breaker.OpenError{Name: name, State: breaker.StateHalfOpen, RetryAfter: 150 * time.Second}
}

// While a route is half-open, a request re-checks within a few seconds
// (the probe usually reports within one call), not after the probe's
// lease; an open route is waited out to its half-open time.
func TestHalfOpenRouteIsRecheckedSoon(t *testing.T) {
	t.Parallel()
	d := New(Config{ModelName: func(llm.Route) string { return "m" }}, Deps{Breakers: halfOpen{}})
	rec := &job.Record{Job: job.Job{ID: "r", Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}}}
	out, rr := d.callRoute(context.Background(), rec, rec.Job.Route, rec.Job.Request, priority.Normal, slog.New(slog.DiscardHandler))
	if rr != routeExhausted || !out.refused || out.retryAfter > halfOpenRecheck {
		t.Fatalf("half-open route: result %d, outcome %+v; want exhausted, refused, retry within %s", rr, out, halfOpenRecheck)
	}
}

// A provisioned deployment's 429 (llm.CodeCapacityFull) makes only its
// key wait out the Retry-After, without escalating (keypool.Full), and
// goes to the next key; the breaker does not count it.
func TestCapacityFullIsNotARefusal(t *testing.T) {
	t.Parallel()
	c := consequenceOf(&llm.Error{Class: llm.ClassRateLimited, Code: llm.CodeCapacityFull, RetryAfter: 300 * time.Millisecond})
	if c.breaker != breaker.Ignore || c.key != keypool.Full || c.next != nextKey {
		t.Fatalf("capacity full: %+v", c)
	}
	if plain := consequenceOf(&llm.Error{Class: llm.ClassRateLimited}); plain.breaker != breaker.Failure {
		t.Fatalf("a plain 429: %+v", plain)
	}
}
