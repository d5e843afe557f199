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

// A worker's call through the pool: acquire the best key, call, settle by
// outcome; when no key has room, wait RetryAfter (or fall back / re-enqueue
// with that delay). Compiled, not run: it needs Redis and a provider.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer rdb.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	pool, err := keypool.New(ctx, rdb, keypool.Config{Keys: []keypool.Key{
		{ID: "claude-sonnet-1", Provider: llm.ProviderClaude, Tier: "sonnet",
			APIKey: secret.New(os.Getenv("CLAUDE_API_KEY_1")), RPM: 60, TPM: 80000},
		{ID: "claude-sonnet-2", Provider: llm.ProviderClaude, Tier: "sonnet",
			APIKey: secret.New(os.Getenv("CLAUDE_API_KEY_2")), RPM: 60, TPM: 80000},
	}}, logger)
	if err != nil {
		logger.Error("key pool", "err", err)
		return
	}

	var client llm.Client // a provider adapter
	req := &llm.Request{MaxTokens: 1024}
	route := llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}

	for {
		lease, err := pool.Acquire(ctx, route, 2000+req.MaxTokens)
		var ee *keypool.ExhaustedError
		if errors.As(err, &ee) {
			select {
			case <-time.After(ee.RetryAfter):
				continue
			case <-ctx.Done():
				return
			}
		}
		if err != nil {
			logger.Error("acquire", "err", err)
			return
		}
		res, err := client.Complete(ctx, lease.APIKey, req)
		if err != nil {
			_ = pool.Failure(ctx, lease, err)
			if c, _ := llm.ClassOf(err); c == llm.ClassRateLimited {
				continue // another key of the tier, or wait
			}
			return
		}
		_ = pool.Success(ctx, lease, res.Response.Usage, res.RateLimit)
		return
	}
}
