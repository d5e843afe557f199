// Package pgdb opens Bulwark's PostgreSQL pool: migrations applied, the
// pgvector types registered and the per-connection settings the semantic
// cache needs (see pkg/cache) applied to every connection.
package pgdb

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"bulwark/migrations"
)

// Config configures the pool.
type Config struct {
	DSN      string
	MaxConns int32
	// AfterConnect runs on every new connection (e.g. cache.AfterConnect).
	AfterConnect func(ctx context.Context, conn *pgx.Conn) error
}

// Open connects, applies migrations, and returns the pool. The caller closes it.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// The DSN may hold a password: do not echo it.
		return nil, fmt.Errorf("pgdb: invalid postgres.dsn")
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	// Migrations run on a pool of their own without AfterConnect: a hook
	// that registers types the migrations create (pgvector's) fails on
	// every connection to a fresh database.
	mpool, err := pgxpool.NewWithConfig(ctx, pc.Copy())
	if err != nil {
		return nil, fmt.Errorf("pgdb: open pool: %w", err)
	}
	err = Migrate(ctx, mpool)
	mpool.Close()
	if err != nil {
		return nil, err
	}
	pc.AfterConnect = cfg.AfterConnect
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgdb: open pool: %w", err)
	}
	return pool, nil
}

// Migrate applies every pending migration through the pool.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	db := stdlib.OpenDBFromPool(pool)
	defer func(db *sql.DB) { _ = db.Close() }(db)
	if err := migrations.Up(ctx, db); err != nil {
		return fmt.Errorf("pgdb: %w", err)
	}
	return nil
}
