package history_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// Prune deletes the rows created before the cut, in batches, and keeps the
// others.
func TestPruneKeepsTheRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	now := time.Now()
	const old, recent = 12_000, 3 // more old rows than one batch
	if _, err := pool.Exec(ctx, `
		INSERT INTO requests (id, tenant, priority, status, provider, model_tier, cached, created_at)
		SELECT 'old-' || i, 'demo', 3, 'completed', 'claude', 'sonnet', 'none', $1::timestamptz - i * interval '1 second'
		FROM generate_series(1, $2) AS i`, now.Add(-40*24*time.Hour), old); err != nil {
		t.Fatal(err)
	}
	for i := range recent {
		if _, err := pool.Exec(ctx, `INSERT INTO requests (id, tenant, priority, status, provider, model_tier, cached, created_at)
			VALUES ($1, 'demo', 3, 'completed', 'claude', 'sonnet', 'none', $2)`, fmt.Sprint("new-", i), now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	s := history.New(pool, slog.New(slog.DiscardHandler), time.Minute)
	n, err := s.Prune(ctx, now.Add(-30*24*time.Hour))
	if err != nil || n != old {
		t.Fatalf("Prune = %d, %v; want the %d old rows", n, err, old)
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM requests").Scan(&left); err != nil || left != recent {
		t.Fatalf("%d rows left (%v), want the %d recent ones", left, err, recent)
	}
}

// An outcome PostgreSQL refuses for its data (a time before its timestamps'
// range; text it cannot hold is escaped, TestUnstorableTextIsEscaped) is lost,
// counted and logged, not kept: in the outbox it would fail on every replay
// and hold back every outcome behind it.
func TestRefusedOutcomeIsNotKept(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	rdb := testenv.Redis(t)
	s := history.New(pool, slog.New(slog.DiscardHandler), time.Minute)
	key := "t:" + t.Name() + ":outbox"
	s.Outbox(rdb, key, 10)
	var dropped int
	s.OnDrop = func() { dropped++ }
	now := time.Now()
	rec := &job.Record{Job: job.Job{ID: "bad-answer", Tenant: "demo", Priority: priority.Normal,
		Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}, CreatedAt: now}, Status: job.StatusCompleted,
		State: job.State{FinishedAt: time.Date(-10000, 1, 1, 0, 0, 0, 0, time.UTC), Result: &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "ab"}}}}}
	s.Finished(ctx, rec, 0)
	if n, err := s.Backlog(ctx); err != nil || n != 0 || dropped != 1 {
		t.Fatalf("backlog %d (%v), dropped %d: want the refused outcome dropped, not kept", n, err, dropped)
	}
}

// testPool is a pool on the test's own migrated database.
func testPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
