package service

import (
	"context"
	"errors"
	"fmt"
	"time"

	"bulwark/pkg/pgdb"
)

// PostgreSQL holds the cache and the history; requests run without both.
// A process that finds it unreachable at start-up starts anyway (a fleet's
// APIs and workers must not all stay down with it) and applies the
// migrations once it is back; one that finds it refusing (authentication,
// a failing migration) stops, as for any misconfiguration.

// migrateFirstTry bounds the start-up attempt: a server that hangs rather
// than refusing must not hold the process back for long.
const migrateFirstTry = 10 * time.Second

// migrateRetry is the pause between background attempts.
const migrateRetry = 5 * time.Second

// migrate applies the migrations and reports whether it could; it fails
// only when PostgreSQL answered with an error.
func (b *Base) migrate(ctx context.Context) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, migrateFirstTry)
	err := pgdb.MigrateDSN(tctx, b.pgConfig())
	cancel()
	switch {
	case err == nil:
		b.migrated.Store(true)
		return true, nil
	case !pgdb.Unreachable(err):
		return false, fmt.Errorf("service: postgres: %w", err)
	}
	b.Logger.Error("service: postgres unreachable at start-up: starting without it (cache and history bypassed, "+
		"counted in bulwark_cache_unavailable_total and bulwark_history_write_errors_total); migrations retried every "+
		migrateRetry.String(), "err", err)
	return false, nil
}

func (b *Base) pgConfig() pgdb.Config { return pgdb.Config{DSN: b.Cfg.Postgres.DSN.Reveal()} }

// migrateLater retries the migrations, then prepares the cache, in the
// background until both are done or Close.
func (b *Base) migrateLater(ctx context.Context) {
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	b.stopMigrate = stop
	b.migrating.Add(1)
	go func() {
		defer b.migrating.Done()
		t := time.NewTicker(migrateRetry)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-t.C:
			}
			if err := b.catchUp(bg); err != nil {
				if !pgdb.Unreachable(err) && !errors.Is(err, context.Canceled) {
					b.Logger.Error("service: postgres: start-up work failed; retrying", "err", err)
				}
				continue
			}
			b.migrated.Store(true)
			b.Logger.Info("service: postgres is back: migrations applied; cache and history resume")
			return
		}
	}()
}

// catchUp does what start-up could not: the migrations, then the cache's
// preparation.
func (b *Base) catchUp(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := pgdb.MigrateDSN(ctx, b.pgConfig()); err != nil {
		return err
	}
	if b.Cache != nil {
		return b.Cache.Prepare(ctx)
	}
	return nil
}

// postgresReady is /readyz's check: reachable, and the schema current.
func (b *Base) postgresReady(ctx context.Context) error {
	if !b.migrated.Load() {
		return errors.New("migrations not applied yet")
	}
	return b.PG.Ping(ctx)
}
