package history_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/history"
	"bulwark/pkg/testenv"
)

// Prune deletes the rows created before the cut, in batches, and keeps the
// others.
func TestPruneKeepsTheRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
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
