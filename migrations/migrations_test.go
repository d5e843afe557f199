package migrations_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"

	"bulwark/migrations"
	"bulwark/pkg/testkit/testenv"
)

// Eleven processes starting at once on a fresh database (three api and
// eight workers) each run Up: every one must succeed, whichever creates
// goose's version table, and a later Up finds nothing to do.
func TestUpConcurrentOnFreshDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	dsn := freshDatabase(ctx, t)

	const processes = 11
	errs := make([]error, processes)
	var wg sync.WaitGroup
	for i := range processes {
		wg.Go(func() {
			db, err := sql.Open("pgx", dsn)
			if err != nil {
				errs[i] = err
				return
			}
			defer db.Close()
			errs[i] = migrations.Up(ctx, db)
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", i, err)
		}
	}

	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	began := time.Now()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatalf("Up on a current database: %v", err)
	}
	// Nothing pending: no lock taken, so no probe interval (1 s) waited.
	if took := time.Since(began); took > 900*time.Millisecond {
		t.Errorf("Up on a current database took %s", took)
	}
}

// freshDatabase creates an empty database on the test server, dropped at
// cleanup, and returns its DSN.
func freshDatabase(ctx context.Context, t *testing.T) string {
	t.Helper()
	admin, err := pgx.Connect(ctx, testenv.PGAdminDSN())
	if err != nil {
		t.Fatalf("PostgreSQL at %s is not reachable (run the tests with `make test`): %v", testenv.PGAdminDSN(), err)
	}
	defer admin.Close(context.WithoutCancel(ctx))
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "bulwark_mig_" + hex.EncodeToString(b[:])
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, testenv.PGAdminDSN())
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	u, err := url.Parse(testenv.PGAdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}
