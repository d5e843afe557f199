// Package pgdb opens Bulwark's PostgreSQL pool: migrations applied, the
// pgvector types registered and the per-connection settings the semantic
// cache needs (see pkg/cache) applied to every connection.
//
// PostgreSQL holds the cache and the history, which the service can run
// without: Open never connects, and a caller that finds the server
// unreachable at start-up (Unreachable) can start anyway and apply the
// migrations once it is back.
package pgdb

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// Open returns the pool; it connects on first use. The caller closes it.
func Open(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := parse(cfg)
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

func parse(cfg Config) (*pgxpool.Config, error) {
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		// The DSN may hold a password: do not echo it.
		return nil, fmt.Errorf("pgdb: invalid postgres.dsn")
	}
	if cfg.MaxConns > 0 {
		pc.MaxConns = cfg.MaxConns
	}
	return pc, nil
}

// MigrateDSN applies every pending migration on a pool of its own, without
// AfterConnect: a hook that registers types the migrations create
// (pgvector's) fails on every connection to a fresh database.
func MigrateDSN(ctx context.Context, cfg Config) error {
	pc, err := parse(cfg)
	if err != nil {
		return err
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("pgdb: open pool: %w", err)
	}
	defer pool.Close()
	return Migrate(ctx, pool)
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

// Unreachable reports whether err says the server could not be reached
// (refused, unresolvable, timed out), as opposed to a server that answered
// with an error (authentication, a failing migration): the first is an
// outage to ride out, the second a misconfiguration to stop on.
func Unreachable(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return false
	}
	var netErr net.Error
	var connErr *pgconn.ConnectError
	return errors.As(err, &netErr) || errors.As(err, &connErr) ||
		errors.Is(err, context.DeadlineExceeded)
}
