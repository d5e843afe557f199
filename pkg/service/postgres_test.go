package service_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgSwitch is a TCP proxy in front of the test's PostgreSQL that can be
// down: while it is, every connection is closed at once, as a server that
// is not there would refuse it.
type pgSwitch struct {
	ln     net.Listener
	target string
	up     atomic.Bool
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]bool // open client connections
}

func newPGSwitch(t *testing.T, target string) *pgSwitch {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sw := &pgSwitch{ln: ln, target: target, conns: map[net.Conn]bool{}}
	sw.wg.Add(1)
	go sw.serve()
	t.Cleanup(func() { _ = ln.Close(); sw.wg.Wait() })
	return sw
}

func (sw *pgSwitch) serve() {
	defer sw.wg.Done()
	for {
		c, err := sw.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		if !sw.up.Load() {
			_ = c.Close()
			continue
		}
		go sw.pipe(c)
	}
}

// down stops PostgreSQL as the processes see it: new connections are
// refused and open ones cut.
func (sw *pgSwitch) down() {
	sw.up.Store(false)
	sw.mu.Lock()
	defer sw.mu.Unlock()
	for c := range sw.conns {
		_ = c.Close()
	}
}

func (sw *pgSwitch) pipe(c net.Conn) {
	sw.mu.Lock()
	sw.conns[c] = true
	sw.mu.Unlock()
	defer func() {
		sw.mu.Lock()
		delete(sw.conns, c)
		sw.mu.Unlock()
		_ = c.Close()
	}()
	s, err := net.Dial("tcp", sw.target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() { _, _ = io.Copy(s, c); _ = s.Close() }()
	_, _ = io.Copy(c, s)
}

// dsn is the test database's DSN with the proxy as its host.
func (sw *pgSwitch) dsn(t *testing.T, real string) string {
	u, err := url.Parse(real)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = sw.ln.Addr().String()
	return u.String()
}

func hostOf(t *testing.T, dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// PostgreSQL down when the processes start: they start anyway, /readyz
// stays 200 and names postgres as degraded, requests complete (cache and
// history bypassed, the outcome kept in the outbox); once PostgreSQL is
// back the migrations apply, /readyz is clean again, and the history row of
// the request written while it was down reaches its terminal state.
func TestPostgresDownAtStartUp(t *testing.T) {
	t.Parallel()
	var sw *pgSwitch
	s := newSystem(t, opts{pgDSN: func(real string) string {
		sw = newPGSwitch(t, hostOf(t, real))
		return sw.dsn(t, real)
	}})
	api := s.startAPI()
	s.startWorker()

	code, out, _ := call(t, "GET", api.ts.URL+"/readyz", adminToken, nil)
	if code != 200 || out["ready"] != true || !strings.Contains(asString(out["degraded"]), "postgres") {
		t.Fatalf("readyz with PostgreSQL down: %d %v; want 200, ready, degraded [postgres]", code, out)
	}
	id := api.submit(t, ask("asked while the database is down"))
	api.waitStatus(t, id, 20*time.Second, "completed")
	waitFor(t, 5*time.Second, "the outcome kept for history", func() bool {
		_, out, _ := call(t, "GET", api.ts.URL+"/metrics", adminToken, nil)
		raw, _ := out["_raw"].(string)
		return strings.Contains(raw, "bulwark_history_backlog 1")
	})

	sw.up.Store(true)
	waitFor(t, 20*time.Second, "/readyz without degraded parts", func() bool {
		code, out, _ := call(t, "GET", api.ts.URL+"/readyz", adminToken, nil)
		return code == 200 && out["degraded"] == nil
	})
	conn, err := pgx.Connect(t.Context(), s.pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	waitFor(t, 20*time.Second, "the history row to catch up", func() bool {
		var status string
		err := conn.QueryRow(t.Context(), "SELECT status FROM requests WHERE id = $1", id).Scan(&status)
		return err == nil && status == "completed"
	})
}

// PostgreSQL lost mid-run: requests go on completing, /readyz names it as
// degraded, and the outcome written meanwhile reaches history once it is
// back.
func TestPostgresLostMidRun(t *testing.T) {
	t.Parallel()
	var sw *pgSwitch
	s := newSystem(t, opts{pgDSN: func(real string) string {
		sw = newPGSwitch(t, hostOf(t, real))
		sw.up.Store(true)
		return sw.dsn(t, real)
	}})
	api := s.startAPI()
	s.startWorker()
	before := api.submit(t, ask("asked before the outage"))
	api.waitStatus(t, before, 20*time.Second, "completed")

	sw.down()
	during := api.submit(t, ask("asked during the outage"))
	api.waitStatus(t, during, 20*time.Second, "completed")
	if code, out, _ := call(t, "GET", api.ts.URL+"/readyz", adminToken, nil); code != 200 || !strings.Contains(asString(out["degraded"]), "postgres") {
		t.Fatalf("readyz during the outage: %d %v; want 200 with degraded [postgres]", code, out)
	}

	sw.up.Store(true)
	conn, err := pgx.Connect(t.Context(), s.pgDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(t.Context())
	waitFor(t, 20*time.Second, "both history rows completed", func() bool {
		var n int
		err := conn.QueryRow(t.Context(), "SELECT count(*) FROM requests WHERE id = ANY($1) AND status = 'completed'",
			[]string{before, during}).Scan(&n)
		return err == nil && n == 2
	})
}

func asString(v any) string {
	switch x := v.(type) {
	case []any:
		var b strings.Builder
		for _, e := range x {
			s, _ := e.(string)
			b.WriteString(s + " ")
		}
		return b.String()
	case string:
		return x
	}
	return ""
}
