package storm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// A system's own PostgreSQL server (options.OwnPostgres): a cluster
// initdb'd in the system's folder and run on a free loopback port, so that
// a fault test can stop and start it without touching the server the
// other tests share. It uses the binaries scripts/services.sh uses, so the
// pgvector extension installed for them is available to it too.

// pgBinDirDefault is where scripts/services.sh finds initdb and postgres;
// $BULWARK_PG_BIN overrides it, and without either folder they are looked
// up on PATH.
const pgBinDirDefault = "/usr/lib/postgresql/15/bin"

// pgStopGrace is how long a fast shutdown may take before SIGKILL.
const pgStopGrace = 20 * time.Second

// pgCluster is the on-disk cluster and where it listens.
type pgCluster struct {
	initdb, postgres string // binaries
	dir              string // owned by the server's user; holds data/
	port             int
	owner            pgOwner
}

// pgBinary finds one of PostgreSQL's programs.
func pgBinary(name string) (string, error) {
	for _, d := range []string{os.Getenv("BULWARK_PG_BIN"), pgBinDirDefault} {
		if d == "" {
			continue
		}
		if p := filepath.Join(d, name); isExecutable(p) {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("storm: %s not in $BULWARK_PG_BIN, %s or PATH (scripts/deps.sh installs PostgreSQL): %w",
			name, pgBinDirDefault, err)
	}
	return p, nil
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// initCluster creates a cluster in parent/pg (trust authentication for
// user postgres, no fsync: throw-away data) on a free port.
func initCluster(ctx context.Context, parent string) (*pgCluster, error) {
	c := &pgCluster{dir: filepath.Join(parent, "pg")}
	var err error
	if c.initdb, err = pgBinary("initdb"); err != nil {
		return nil, err
	}
	if c.postgres, err = pgBinary("postgres"); err != nil {
		return nil, err
	}
	if c.owner, err = pgOwnerOf(); err != nil {
		return nil, err
	}
	if c.port, err = freePort(); err != nil {
		return nil, err
	}
	if err := os.Mkdir(c.dir, 0o700); err != nil {
		return nil, fmt.Errorf("storm: postgres folder: %w", err)
	}
	if c.owner.root {
		// The server's user must reach its folder through the system's
		// (0700, root's): search permission only, no listing.
		if err := os.Chmod(parent, 0o711); err != nil {
			return nil, fmt.Errorf("storm: postgres folder: %w", err)
		}
		if err := os.Chown(c.dir, int(c.owner.uid), int(c.owner.gid)); err != nil {
			return nil, fmt.Errorf("storm: postgres folder: %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, c.initdb, "-D", c.dataDir(), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	cmd.Dir = c.dir
	cmd.SysProcAttr = c.owner.attr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("storm: initdb: %w\n%s", err, out)
	}
	return c, nil
}

func (c *pgCluster) dataDir() string { return filepath.Join(c.dir, "data") }

// adminDSN is the superuser DSN of the server's maintenance database.
func (c *pgCluster) adminDSN() string {
	return "postgres://postgres@127.0.0.1:" + strconv.Itoa(c.port) + "/postgres?sslmode=disable"
}

// args are the server's settings: loopback only, its socket in its own
// folder, no durability (the data is thrown away).
func (c *pgCluster) args() []string {
	return []string{"-D", c.dataDir(), "-c", "listen_addresses=127.0.0.1", "-c", "port=" + strconv.Itoa(c.port),
		"-c", "unix_socket_directories=" + c.dir, "-c", "max_connections=100",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"}
}

// startPostgres starts the system's own server (postgres, postgres-2, …)
// and returns once it accepts connections.
func (s *system) startPostgres(ctx context.Context) error {
	s.mu.Lock()
	n := 1
	for _, p := range s.procs {
		if isPostgres(p.name) {
			n++
		}
	}
	s.mu.Unlock()
	name := "postgres"
	if n > 1 {
		name = fmt.Sprintf("postgres-%d", n)
	}
	p, err := startProcessAttr(name, s.dir, s.pg.postgres, s.pg.args(), os.Environ(), s.pg.owner.attr(), s.onExit)
	if err != nil {
		return err
	}
	s.addProc(p)
	s.mu.Lock()
	s.postgres = p
	s.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	return waitReady(rctx, p, "connect "+s.pg.adminDSN(), pgReady(s.pg.adminDSN()))
}

// stopPostgres stops the system's own server with a fast shutdown
// (SIGINT: open transactions rolled back, clients disconnected, a clean
// checkpoint) and waits for it to exit. A no-op when it is not running.
func (s *system) stopPostgres() error {
	s.mu.Lock()
	p := s.postgres
	s.postgres = nil
	s.mu.Unlock()
	if p == nil {
		return nil
	}
	p.stopping.Store(true)
	if done, _ := p.exited(); !done {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
	}
	select {
	case <-p.done:
	case <-time.After(pgStopGrace):
		p.kill()
		return fmt.Errorf("storm: %s did not shut down within %s of SIGINT; killed", p.name, pgStopGrace)
	}
	if p.exitErr != nil {
		return fmt.Errorf("storm: %s fast shutdown: %w", p.name, p.exitErr)
	}
	return nil
}

// isPostgres reports whether a process name is one of the PostgreSQL
// servers.
func isPostgres(name string) bool { return name == "postgres" || strings.HasPrefix(name, "postgres-") }

// pgReady checks that the server at dsn accepts a connection and a query
// (while starting up it refuses with "the database system is starting
// up").
func pgReady(dsn string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
		return conn.Ping(ctx)
	}
}

// historyStatuses returns the status of each of ids that has a row in
// the requests table of the database at dsn.
func historyStatuses(ctx context.Context, dsn string, ids []string) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("storm: history: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	rows, err := conn.Query(ctx, "SELECT id, status FROM requests WHERE id = ANY($1)", ids)
	if err != nil {
		return nil, fmt.Errorf("storm: history: %w", err)
	}
	out := make(map[string]string, len(ids))
	var id, status string
	_, err = pgx.ForEachRow(rows, []any{&id, &status}, func() error {
		out[id] = status
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storm: history: %w", err)
	}
	return out, nil
}

// errNoPostgresUser is returned as root when there is no user postgres
// to run the server as.
var errNoPostgresUser = errors.New("storm: running as root, and PostgreSQL refuses to: no user postgres to run it as")
