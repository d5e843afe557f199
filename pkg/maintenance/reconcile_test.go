package maintenance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// reconcileFixture is the reconcile job over real Redis and PostgreSQL:
// live records in a job.Store, rows in a history.Store.
type reconcileFixture struct {
	jobs *Jobs
	live *job.Store
	hist *history.Store
	pg   *pgxpool.Pool
	rdb  *redis.Client
	lost atomic.Int64
}

const reconcileTTL = 24 * time.Hour

func newReconcile(t *testing.T) *reconcileFixture {
	t.Helper()
	rdb := testenv.Redis(t)
	pg, err := pgxpool.New(t.Context(), testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pg.Close)
	f := &reconcileFixture{live: job.NewStore(rdb, "t:{job}:", reconcileTTL), pg: pg, rdb: rdb,
		hist: history.New(pg, slog.New(slog.DiscardHandler), time.Minute)}
	f.hist.Outbox(rdb, "t:history:outbox", 100)
	f.jobs = New(Deps{Unended: f.hist, Records: f.live, RecordTTL: reconcileTTL, Redis: rdb, Prefix: "t:",
		OnLost: func(n int64) { f.lost.Add(n) }, Logger: slog.New(slog.DiscardHandler)})
	return f
}

// accept stores a request created age ago as intake does: its live record
// when live, then its history row, with status st.
func (f *reconcileFixture) accept(t *testing.T, id string, age time.Duration, st job.Status, live bool) {
	t.Helper()
	created := time.Now().Add(-age)
	j := &job.Job{ID: id, Tenant: "demo", Priority: priority.Normal, Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"},
		CreatedAt: created, Deadline: created.Add(5 * time.Minute)}
	if live {
		if _, _, err := f.live.Create(t.Context(), j, job.Event{Type: job.EventQueued}, "", 0); err != nil {
			t.Fatal(err)
		}
	}
	f.hist.Submitted(t.Context(), j, job.StatusQueued, job.CachedNone)
	if st.Terminal() {
		f.hist.Finished(t.Context(), &job.Record{Job: *j, Status: st, State: job.State{FinishedAt: time.Now()}}, 0)
	}
}

func (f *reconcileFixture) status(t *testing.T, id string) (job.Status, string) {
	t.Helper()
	row, err := f.hist.Get(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	return row.Status, row.Error
}

func (f *reconcileFixture) run(t *testing.T) {
	t.Helper()
	if err := f.jobs.reconcile(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
}

// A row with no ending whose live record is gone ends failed/lost; a row
// whose record lives (a request still running), a row already ended, a
// request too young to judge and one so old its record may have expired
// keep theirs. A real ending written later (the outbox) still wins.
func TestReconcileEndsLostRequests(t *testing.T) {
	t.Parallel()
	f := newReconcile(t)
	f.accept(t, "lost", 20*time.Minute, job.StatusQueued, false)
	f.accept(t, "running", 20*time.Minute, job.StatusQueued, true)
	f.accept(t, "ended", 20*time.Minute, job.StatusCompleted, false)
	f.accept(t, "young", time.Minute, job.StatusQueued, false)
	f.accept(t, "expired", reconcileTTL, job.StatusQueued, false)
	// A watched request too old to judge (its record may have expired) is
	// forgotten, not judged.
	old := float64(time.Now().Add(-reconcileTTL).UnixMilli())
	f.rdb.ZAdd(t.Context(), "t:history:reconcile:watch", redis.Z{Score: old, Member: "expired"})
	f.run(t)
	if err := f.rdb.ZScore(t.Context(), "t:history:reconcile:watch", "expired").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("a request too old to judge is still watched (%v)", err)
	}

	if st, msg := f.status(t, "lost"); st != job.StatusFailed || msg != job.LostReason {
		t.Fatalf("lost request's row: %s %q, want failed with job.LostReason", st, msg)
	}
	for id, want := range map[string]job.Status{"running": job.StatusQueued, "ended": job.StatusCompleted,
		"young": job.StatusQueued, "expired": job.StatusQueued} {
		if st, _ := f.status(t, id); st != want {
			t.Errorf("%s: row %s, want %s", id, st, want)
		}
	}
	if n := f.lost.Load(); n != 1 {
		t.Fatalf("counted %d lost, want 1", n)
	}

	// The next run goes on from its cursor: the young request, once old
	// enough, is judged; nothing is counted twice.
	f.jobs.d.ReconcileAfter = 30 * time.Second
	f.run(t)
	if st, _ := f.status(t, "young"); st != job.StatusFailed {
		t.Fatalf("young request, once old enough: %s, want failed", st)
	}
	if n := f.lost.Load(); n != 2 {
		t.Fatalf("counted %d lost after the second run, want 2", n)
	}

	// The request still running when judged is watched: lost later (its
	// record gone with a failover), it is judged again and ended, once.
	if err := f.rdb.Del(t.Context(), "t:{job}:job:running").Err(); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	if st, msg := f.status(t, "running"); st != job.StatusFailed || msg != job.LostReason {
		t.Fatalf("running request lost later: %s %q, want failed/lost", st, msg)
	}
	f.run(t)
	if n := f.lost.Load(); n != 3 {
		t.Fatalf("counted %d lost after the watched request's loss, want 3", n)
	}
	if n := f.rdb.ZCard(t.Context(), "t:history:reconcile:watch").Val(); n != 0 {
		t.Fatalf("%d requests still watched, want none", n)
	}

	// An ending that arrives after all (replayed from the outbox) replaces
	// the reconciler's.
	rec := &job.Record{Job: job.Job{ID: "lost", Tenant: "demo", Priority: priority.Normal, CreatedAt: time.Now().Add(-20 * time.Minute),
		Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}}, Status: job.StatusCompleted}
	f.hist.Finished(t.Context(), rec, 0)
	if st, msg := f.status(t, "lost"); st != job.StatusCompleted || msg != "" {
		t.Fatalf("after a late ending: %s %q, want completed", st, msg)
	}
}

// More lost rows than one batch, all created at the same instant (as
// after a restart of Redis without persistence, to the microsecond here):
// one run ends them all, in several steps, and a second run finds none.
func TestReconcileManyAtOneInstant(t *testing.T) {
	t.Parallel()
	f := newReconcile(t)
	n := reconcileBatch*2 + 500
	created := time.Now().Add(-30 * time.Minute)
	if _, err := f.pg.Exec(t.Context(), `
		INSERT INTO requests (id, tenant, priority, status, provider, model_tier, created_at)
		SELECT 'r' || g, 'demo', 3, 'queued', 'claude', 'sonnet', $1 FROM generate_series(1, $2) g`, created, n); err != nil {
		t.Fatal(err)
	}
	f.accept(t, "running", 30*time.Minute, job.StatusQueued, true)
	f.run(t)
	if got := f.lost.Load(); got != int64(n) {
		t.Fatalf("ended %d lost rows, want %d", got, n)
	}
	var left int
	if err := f.pg.QueryRow(context.Background(), `SELECT count(*) FROM requests WHERE status = 'queued'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 1 {
		t.Fatalf("%d rows still queued, want only the running request's", left)
	}
	f.run(t)
	if got := f.lost.Load(); got != int64(n) {
		t.Fatalf("second run counted %d more", got-int64(n))
	}
}

// While endings wait in the history outbox (PostgreSQL was away), rows are
// not judged: a row open only for that is not lost.
func TestReconcileWaitsForTheOutbox(t *testing.T) {
	t.Parallel()
	f := newReconcile(t)
	f.accept(t, "pending", 20*time.Minute, job.StatusQueued, false)
	if err := f.rdb.LPush(t.Context(), "t:history:outbox", "an ending").Err(); err != nil {
		t.Fatal(err)
	}
	f.run(t)
	if st, _ := f.status(t, "pending"); st != job.StatusQueued || f.lost.Load() != 0 {
		t.Fatalf("judged with an outbox backlog: %s, %d lost", st, f.lost.Load())
	}
	f.rdb.Del(t.Context(), "t:history:outbox")
	f.run(t)
	if st, _ := f.status(t, "pending"); st != job.StatusFailed {
		t.Fatalf("once the outbox is empty: %s, want failed", st)
	}
}

// Redis failing leaves the cursor where it was: nothing is skipped.
func TestReconcileKeepsTheCursorOnError(t *testing.T) {
	t.Parallel()
	f := newReconcile(t)
	f.accept(t, "lost", 20*time.Minute, job.StatusQueued, false)
	f.jobs.d.Records = failingRecords{}
	if err := f.jobs.reconcile(t.Context(), nil); err == nil {
		t.Fatal("no error with the records unreadable")
	}
	f.jobs.d.Records = f.live
	f.run(t)
	if st, _ := f.status(t, "lost"); st != job.StatusFailed {
		t.Fatalf("after the error: %s, want failed", st)
	}
}

type failingRecords struct{}

func (failingRecords) Missing(context.Context, []string) ([]string, error) {
	return nil, fmt.Errorf("redis down")
}

// A result_ttl too short for any request to be judged is said at start,
// not left to a job that silently does nothing.
func TestReconcileWarnsOfANarrowWindow(t *testing.T) {
	t.Parallel()
	for ttl, warn := range map[time.Duration]bool{15 * time.Minute: true, time.Hour: false} {
		var buf bytes.Buffer
		New(Deps{Unended: (*history.Store)(nil), RecordTTL: ttl, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
		if got := strings.Contains(buf.String(), "raise server.result_ttl"); got != warn {
			t.Errorf("result_ttl %s: warned %v, want %v (%q)", ttl, got, warn, buf.String())
		}
	}
}

// A replay that took endings from the outbox and has not written them yet
// (here: stuck behind a row lock on the first) still holds them for the
// reconcile job: a row whose ending it holds is not judged lost, and gets
// its ending once the replay goes on.
func TestReconcileWaitsForAReplayInProgress(t *testing.T) {
	t.Parallel()
	f := newReconcile(t)
	ctx := t.Context()
	f.accept(t, "blocker", 20*time.Minute, job.StatusQueued, true)
	f.accept(t, "held", 20*time.Minute, job.StatusQueued, false)
	// Both endings wait in the outbox (PostgreSQL was away), blocker's first.
	down := history.New(deadPG(t), slog.New(slog.DiscardHandler), time.Minute)
	down.Outbox(f.rdb, "t:history:outbox", 100)
	for _, id := range []string{"blocker", "held"} {
		row, _ := f.hist.Get(ctx, id)
		down.Finished(ctx, &job.Record{Job: job.Job{ID: id, Tenant: "demo", Priority: priority.Normal, Route: row.Route,
			CreatedAt: row.CreatedAt}, Status: job.StatusCompleted, State: job.State{FinishedAt: time.Now()}}, 0)
	}
	tx, err := f.pg.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT 1 FROM requests WHERE id = 'blocker' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	replayed := make(chan error, 1)
	go func() { _, err := f.hist.Replay(ctx); replayed <- err }()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, _ := f.rdb.LLen(ctx, "t:history:outbox").Result(); n == 0 {
			break // the replay took both and is stuck on the first
		}
		if time.Now().After(deadline) {
			t.Fatal("the replay never took the endings")
		}
	}
	f.run(t)
	if st, _ := f.status(t, "held"); st != job.StatusQueued || f.lost.Load() != 0 {
		t.Fatalf("judged while a replay held its ending: %s, %d lost", st, f.lost.Load())
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-replayed; err != nil {
		t.Fatal(err)
	}
	if st, _ := f.status(t, "held"); st != job.StatusCompleted {
		t.Fatalf("after the replay: %s, want completed", st)
	}
	if n, _ := f.hist.Backlog(ctx); n != 0 {
		t.Fatalf("backlog %d after the replay", n)
	}
}

// deadPG is a pool on a port nothing listens on: PostgreSQL down.
func deadPG(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	pool, err := pgxpool.New(t.Context(), "postgres://postgres@"+addr+"/x?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
