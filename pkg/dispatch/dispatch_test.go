package dispatch

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

func TestWaitingIsNotAFailure(t *testing.T) {
	t.Parallel()
	w := &waitError{Delay: 1500 * time.Millisecond}
	if IsFailure(w) || !IsFailure(errors.New("x")) || !IsFailure(&transientError{Delay: time.Second, Err: errors.New("5xx")}) {
		t.Fatal("IsFailure: waiting for capacity must not count; anything else must")
	}
	if got := RetryDelay(3, w, nil); got != w.Delay {
		t.Fatalf("wait delay %s", got)
	}
	if got := RetryDelay(0, &transientError{Delay: 2 * time.Second, Err: errors.New("x")}, nil); got != 2*time.Second {
		t.Fatalf("transient delay %s", got)
	}
	// A task whose worker died comes back within about a second, not
	// asynq's default of 16 s or more.
	if got := RetryDelay(1, asynq.ErrLeaseExpired, nil); got > 1300*time.Millisecond || got < 700*time.Millisecond {
		t.Fatalf("lease-expired delay %s", got)
	}
}

func TestBackoff(t *testing.T) {
	t.Parallel()
	prev := time.Duration(0)
	for n := range 12 {
		d := backoff(n)
		base := min(500*time.Millisecond<<n, 30*time.Second)
		if d < base*3/4 || d > base*5/4 {
			t.Fatalf("backoff(%d) = %s, outside %s ±25%%", n, d, base)
		}
		if n < 5 && d <= prev/2 {
			t.Fatalf("backoff(%d) = %s did not grow from %s", n, d, prev)
		}
		prev = d
	}
}
