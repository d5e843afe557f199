// Package migrations holds Bulwark's SQL schema, embedded in every binary
// and applied at start-up with goose.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS returns the migration files.
func FS() fs.FS { return files }

// Lock probing: goose's session locker tries the advisory lock once per
// lockProbe, at most lockProbes times (5 minutes in all, goose's default
// total). goose's default probe of 5 s made eleven processes started at
// once wait for each other in 5 s steps, 10 s in all.
const (
	lockProbe  = 1 // seconds
	lockProbes = 300
)

// Up applies every pending migration to db. It is safe to call from several
// processes at once: goose takes a PostgreSQL advisory lock. A process
// that finds nothing pending (read without the lock) does not take it, so
// processes started after the first do not queue behind each other.
func Up(ctx context.Context, db *sql.DB) error {
	if current(ctx, db) {
		return nil
	}
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockTimeout(lockProbe, lockProbes))
	if err != nil {
		return fmt.Errorf("migrations: locker: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrations: up: %w", err)
	}
	return nil
}

// current reports whether every migration is applied, read without the
// lock and without writing: false when in doubt (Up then decides under the
// lock). goose's HasPending creates the version table when it is missing,
// outside the lock, racing the process that holds it, so it is asked only
// once the table exists, and through a provider of its own (goose creates
// the table once per provider and would not try again).
func current(ctx context.Context, db *sql.DB) bool {
	var exists bool
	if err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL", goose.DefaultTablename).Scan(&exists); err != nil || !exists {
		return false
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files)
	if err != nil {
		return false
	}
	pending, err := p.HasPending(ctx)
	return err == nil && !pending
}
