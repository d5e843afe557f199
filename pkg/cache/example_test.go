package cache_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/cache"
	"bulwark/pkg/embed"
	"bulwark/pkg/job"
)

// The API's layer 1: look up, and on a miss call the provider and store
// the final answer. Errors wrapping ErrUnavailable mean "bypass the cache".
func Example() {
	ctx := context.Background()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg := cache.Config{}

	pc, err := pgxpool.ParseConfig(os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	pc.AfterConnect = cache.AfterConnectWith(cfg) // iterative HNSW scan, ef_search, pgvector types
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	emb, err := embed.New(embed.Config{}) // local n-gram embedder, 384 dims
	if err != nil {
		panic(err)
	}
	c, err := cache.New(ctx, pool, emb, cfg, logger)
	if err != nil {
		panic(err)
	}
	c.Start(ctx) // background writer of hit counts
	defer c.Stop()

	k := cache.Key{
		Tenant: "acme", Tier: "claude/sonnet", Layer: cache.LayerAgent,
		ToolResultsHash: "sha256-of-tool-results", CaseID: "case-42",
		Context: "You are a vehicle diagnosis assistant.",
		Prompt:  "BMS update stopped at 63% with P0A80 on VIN LSVAU2180N2183294. Root cause?",
	}
	vec, _ := c.Embed(ctx, k.Prompt) // once per request, for Lookup and Store
	hit, err := c.Lookup(ctx, k, vec)
	if err != nil && !errors.Is(err, cache.ErrUnavailable) {
		panic(err) // a bad key: the caller's bug
	}
	if hit.Kind != job.CachedNone {
		_ = hit.Response // answer at 0 tokens
		return
	}
	answer := json.RawMessage(`{"content":"..."}`) // the provider's final answer
	if vec != nil {
		_ = c.Store(ctx, k, vec, answer)
	}
}
