package breaker_test

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/breaker"
)

// Example shows a worker guarding one provider call with the route's
// breaker. (It needs a Redis server, so it is compiled but not run.)
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()

	breakers, err := breaker.New(rdb, breaker.Config{
		OnTransition: func(name string, from, to breaker.State, reason string) {
			slog.Warn("breaker moved", "breaker", name, "from", from, "to", to, "reason", reason)
		},
	}, slog.Default())
	if err != nil {
		panic(err)
	}

	permit, err := breakers.Allow(ctx, "claude/sonnet")
	var open *breaker.OpenError
	switch {
	case errors.As(err, &open):
		// Try the fallback route, or re-enqueue after open.RetryAfter.
		_ = min(open.RetryAfter, 30*time.Second)
		return
	case err != nil:
		// Redis is down: failing open (calling anyway) is the caller's choice.
		return
	}
	callErr := callProvider(ctx)
	switch {
	case callErr == nil:
		permit.Done(ctx, breaker.Success)
	case errors.Is(callErr, errRateLimited):
		permit.DoneReason(ctx, breaker.Failure, "rate_limited")
	default: // the request's own fault, or cancelled: says nothing about the route
		permit.Done(ctx, breaker.Ignore)
	}

	// When every route is exhausted:
	breakers.Trip(ctx, breaker.AllName, "all providers exhausted")
}

var errRateLimited = errors.New("rate limited")

func callProvider(context.Context) error { return nil }
