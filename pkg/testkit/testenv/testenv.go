// Package testenv gives tests their own slice of the real Redis and
// PostgreSQL that `make test` starts (scripts/services.sh): a Redis logical
// database nobody else uses while the test runs, and a fresh PostgreSQL
// database created from a migrated template. Nothing here is a mock.
//
// For the tests of Redis Sentinel and Redis Cluster it starts servers of
// the test's own (redisha.go): RedisCluster, three masters; RedisSentinel,
// a master, a replica and three sentinels that can fail it over.
//
// Environment: BULWARK_TEST_REDIS (host:port, default 127.0.0.1:16380) and
// BULWARK_TEST_PG (a DSN of the maintenance database, default
// postgres://postgres@127.0.0.1:15433/postgres?sslmode=disable).
package testenv

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver for goose
	"github.com/redis/go-redis/v9"

	"bulwark/migrations"
)

const (
	redisDatabases = 64 // scripts/services.sh starts Redis with --databases 64
	leaseTTL       = 15 * time.Minute
)

// RedisAddr returns the test Redis address.
func RedisAddr() string {
	if a := os.Getenv("BULWARK_TEST_REDIS"); a != "" {
		return a
	}
	return "127.0.0.1:16380"
}

// PGAdminDSN returns the DSN of the test server's maintenance database.
func PGAdminDSN() string {
	if d := os.Getenv("BULWARK_TEST_PG"); d != "" {
		return d
	}
	return "postgres://postgres@127.0.0.1:15433/postgres?sslmode=disable"
}

// RedisOptions returns options for a Redis logical database that only this
// test uses; it is empty at the start and released at cleanup.
func RedisOptions(t testing.TB) *redis.Options {
	t.Helper()
	ctx := context.Background()
	admin := redis.NewClient(&redis.Options{Addr: RedisAddr(), DB: 0})
	defer admin.Close()
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatalf("testenv: Redis at %s is not reachable (run the tests with `make test`): %v", RedisAddr(), err)
	}
	owner := randomID()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		for db := 1; db < redisDatabases; db++ {
			key := fmt.Sprintf("testenv:db:%d", db)
			ok, err := admin.SetNX(ctx, key, owner, leaseTTL).Result()
			if err != nil {
				t.Fatalf("testenv: lease Redis db: %v", err)
			}
			if !ok {
				continue
			}
			opt := &redis.Options{Addr: RedisAddr(), DB: db}
			c := redis.NewClient(opt)
			err = c.FlushDB(ctx).Err()
			c.Close()
			if err != nil {
				t.Fatalf("testenv: flush Redis db %d: %v", db, err)
			}
			t.Cleanup(func() {
				c := redis.NewClient(&redis.Options{Addr: RedisAddr(), DB: 0})
				defer c.Close()
				if v, _ := c.Get(context.Background(), key).Result(); v == owner {
					c.Del(context.Background(), key)
				}
			})
			return opt
		}
		if time.Now().After(deadline) {
			t.Fatal("testenv: no free Redis database for two minutes")
		}
		time.Sleep(50 * time.Millisecond) // all leased: poll for a release
	}
}

// Redis returns a client on the test's own Redis database, closed at cleanup.
func Redis(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(RedisOptions(t))
	t.Cleanup(func() { c.Close() })
	return c
}

// Postgres returns the DSN of a new database with every migration applied,
// dropped at cleanup.
func Postgres(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, PGAdminDSN())
	if err != nil {
		t.Fatalf("testenv: PostgreSQL at %s is not reachable (run the tests with `make test`): %v", PGAdminDSN(), err)
	}
	defer admin.Close(ctx)

	tmpl, err := ensureTemplate(ctx, admin)
	if err != nil {
		t.Fatalf("testenv: template database: %v", err)
	}
	name := "bulwark_t_" + randomID()
	// CREATE DATABASE ... TEMPLATE fails while another session is connected
	// to the template; the advisory lock serialises copies across packages.
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		t.Fatalf("testenv: lock: %v", err)
	}
	_, err = admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, tmpl))
	admin.Exec(ctx, "SELECT pg_advisory_unlock(4242)")
	if err != nil {
		t.Fatalf("testenv: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, PGAdminDSN())
		if err != nil {
			return
		}
		defer c.Close(ctx)
		c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", name))
	})
	return dsnWithDB(t, name)
}

// ensureTemplate creates, once per migration set, a template database with
// every migration applied, and returns its name.
func ensureTemplate(ctx context.Context, admin *pgx.Conn) (string, error) {
	name := "bulwark_tmpl_" + migrationsHash()
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(4242)"); err != nil {
		return "", err
	}
	defer admin.Exec(ctx, "SELECT pg_advisory_unlock(4242)")
	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	build := name + "_build"
	admin.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", build))
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s", build)); err != nil {
		return "", err
	}
	db, err := sql.Open("pgx", dsnFor(build))
	if err != nil {
		return "", err
	}
	err = migrations.Up(ctx, db)
	db.Close()
	if err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", build, name)); err != nil {
		return "", err
	}
	return name, nil
}

func migrationsHash() string {
	h := sha256.New()
	fs.WalkDir(migrations.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := fs.ReadFile(migrations.FS(), path)
		h.Write([]byte(path))
		h.Write(b)
		return nil
	})
	return hex.EncodeToString(h.Sum(nil))[:12]
}

func dsnFor(db string) string {
	u, err := url.Parse(PGAdminDSN())
	if err != nil {
		return PGAdminDSN()
	}
	u.Path = "/" + db
	return u.String()
}

func dsnWithDB(t testing.TB, db string) string {
	t.Helper()
	d := dsnFor(db)
	if !strings.Contains(d, db) {
		t.Fatalf("testenv: cannot build a DSN from %q", PGAdminDSN())
	}
	return d
}

func randomID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// SilentServer listens on a loopback port, accepts every connection and
// never sends a byte: a server that hangs rather than refuses (a database
// or relay stuck under load). It returns the address; everything is
// closed at cleanup.
func SilentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}
