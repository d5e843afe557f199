package keypool_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/keypool"
	"bulwark/pkg/llm"
	"bulwark/pkg/secret"
)

// A worker's call through the pool: reserve the best key, waiting up to
// 2 s for one in turn with every other worker (no polling), wait until the
// lease's NotBefore, call, and settle by outcome. When no key has room
// within the horizon, fall back or re-enqueue after RetryAfter. Compiled,
// not run: it needs Redis and a provider.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	// Window and Pace keep their defaults: buckets of one second of each
	// limit, spent at 98% of it.
	pool, err := keypool.New(ctx, rdb, keypool.Config{Keys: []keypool.Key{
		{ID: "claude-sonnet-1", Provider: llm.ProviderClaude, Tier: "sonnet",
			Cred: llm.Credential{APIKey: secret.New(os.Getenv("CLAUDE_API_KEY_1"))}, RPM: 60, TPM: 80000},
		{ID: "claude-sonnet-2", Provider: llm.ProviderClaude, Tier: "sonnet",
			Cred: llm.Credential{APIKey: secret.New(os.Getenv("CLAUDE_API_KEY_2"))}, RPM: 60, TPM: 80000,
			ITPM: 64000, OTPM: 16000}, // Anthropic's input and output limits, metered apart
	}}, logger)
	if err != nil {
		logger.Error("key pool", "err", err)
		return
	}

	var client llm.Client // a provider adapter
	req := &llm.Request{MaxTokens: 1024}
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}

	for range 3 { // a 429 cools its key: try another one
		err := call(ctx, pool, client, route, req)
		var ee *keypool.ExhaustedError
		switch {
		case err == nil:
			return
		case errors.As(err, &ee):
			logger.Info("no key within 2s: fall back or re-enqueue", "retry_after", ee.RetryAfter, "reason", ee.Reason)
			return
		case actionFor(err) != keypool.Cool:
			logger.Error("call", "err", err)
			return
		}
	}
}

// call makes one provider call on a key of route.
func call(ctx context.Context, pool *keypool.Pool, client llm.Client, route llm.Route, req *llm.Request) error {
	// The prompt and max_tokens apart, for a key with ITPM and OTPM.
	est := llm.EstimateRequest(req)
	lease, err := pool.Acquire(ctx, route, est.Total(), keypool.Split(est.Input, est.Output), keypool.Within(2*time.Second))
	if err != nil {
		return err
	}
	// The reservation may be for a moment ahead: wait for it, and give it
	// back if the caller stops waiting first.
	if d := lease.Delay(); d > 0 {
		timer := time.NewTimer(d)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			_ = pool.Return(ctx, lease)
			return ctx.Err()
		}
	}
	defer pool.Release(ctx, lease) // no-op once settled
	res, err := client.Complete(ctx, lease.Cred, req)
	if err != nil {
		_ = pool.Failure(ctx, lease, actionFor(err), err)
		return err
	}
	return pool.Success(ctx, lease, res.Response.Usage, res.RateLimit)
}

// actionFor is the dispatcher's class → action table (pkg/dispatch) in
// brief.
func actionFor(err error) keypool.Action {
	switch c, _ := llm.ClassOf(err); c {
	case llm.ClassRateLimited:
		return keypool.Cool
	case llm.ClassQuota, llm.ClassAuth:
		return keypool.Disable
	}
	return keypool.Refund
}
