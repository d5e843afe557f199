package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"testing"

	"bulwark/pkg/llm"
)

// timeoutNetError is a net.Error that timed out, as a dial or read
// deadline produces.
type timeoutNetError struct{}

func (timeoutNetError) Error() string   { return "i/o timeout" }
func (timeoutNetError) Timeout() bool   { return true }
func (timeoutNetError) Temporary() bool { return true }

var _ net.Error = timeoutNetError{}

func TestOutcome(t *testing.T) {
	t.Parallel()
	transient := func(status int, cause error) error {
		return &llm.Error{Class: llm.ClassTransient, Provider: llm.ProviderClaude, Status: status, Err: cause}
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, OutcomeOK},
		{"rate limited", &llm.Error{Class: llm.ClassRateLimited, Status: 429, Code: "rate_limit_error"}, OutcomeRateLimited},
		{"quota", &llm.Error{Class: llm.ClassQuota, Status: 429, Code: "insufficient_quota"}, OutcomeQuota},
		{"overloaded", &llm.Error{Class: llm.ClassOverloaded, Status: 529}, OutcomeOverloaded},
		{"auth", &llm.Error{Class: llm.ClassAuth, Status: 401}, OutcomeAuth},
		{"permanent", &llm.Error{Class: llm.ClassPermanent, Status: 400}, OutcomeBadRequest},
		{"transient 500", transient(500, nil), OutcomeServerError},
		{"transient connection refused", transient(0, errors.New("connect: connection refused")), OutcomeServerError},
		{"transient context deadline", transient(0, context.DeadlineExceeded), OutcomeTimeout},
		{"transient wrapped deadline", transient(0, fmt.Errorf("read body: %w", context.DeadlineExceeded)), OutcomeTimeout},
		{"transient socket deadline", transient(0, os.ErrDeadlineExceeded), OutcomeTimeout},
		{"transient net timeout", transient(0, &net.OpError{Op: "read", Err: timeoutNetError{}}), OutcomeTimeout},
		{"transient 504", transient(504, nil), OutcomeTimeout},
		{"transient 408", transient(408, nil), OutcomeTimeout},
		{"wrapped provider error", fmt.Errorf("call claude: %w", &llm.Error{Class: llm.ClassQuota}), OutcomeQuota},
		{"unknown class", &llm.Error{Class: "bogus"}, OutcomeServerError},
		{"our deadline", fmt.Errorf("acquire key: %w", context.DeadlineExceeded), OutcomeTimeout},
		{"plain error", errors.New("boom"), OutcomeServerError},
		{"cancelled", context.Canceled, OutcomeServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Outcome(tt.err); got != tt.want {
				t.Errorf("Outcome(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

// TestOutcomeCoversEveryClass fails when pkg/llm gains a class that
// Outcome does not map deliberately (it would fall to server_error).
func TestOutcomeCoversEveryClass(t *testing.T) {
	t.Parallel()
	want := map[llm.Class]string{
		llm.ClassRateLimited: OutcomeRateLimited,
		llm.ClassQuota:       OutcomeQuota,
		llm.ClassOverloaded:  OutcomeOverloaded,
		llm.ClassTransient:   OutcomeServerError,
		llm.ClassAuth:        OutcomeAuth,
		llm.ClassPermanent:   OutcomeBadRequest,

		llm.ClassModelUnavailable: OutcomeModelUnavailable,
	}
	seen := map[string]bool{OutcomeOK: true}
	for _, c := range llm.Classes {
		w, ok := want[c]
		if !ok {
			t.Errorf("class %q has no outcome: map it in Outcome and add it here", c)
			continue
		}
		got := Outcome(&llm.Error{Class: c})
		if got != w {
			t.Errorf("Outcome(class %q) = %q, want %q", c, got, w)
		}
		if !slices.Contains(Outcomes, got) {
			t.Errorf("Outcome(class %q) = %q, not in Outcomes", c, got)
		}
		seen[got] = true
	}
	seen[Outcome(&llm.Error{Class: llm.ClassTransient, Err: context.DeadlineExceeded})] = true
	if got := Outcome(&llm.Error{Class: llm.ClassRateLimited, Code: llm.CodeCapacityFull}); got != OutcomeCapacityFull {
		t.Errorf("Outcome(a provisioned deployment's 429) = %q, want %q", got, OutcomeCapacityFull)
	}
	seen[OutcomeCapacityFull] = true
	for _, o := range Outcomes {
		if !seen[o] {
			t.Errorf("outcome %q is in Outcomes but no class produces it", o)
		}
	}
}
