package history_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/llm"
	"bulwark/pkg/priority"
	"bulwark/pkg/testkit/testenv"
)

// logs records what a store logs.
type logs struct {
	mu   sync.Mutex
	msgs []string // "LEVEL message"
}

func (l *logs) Enabled(context.Context, slog.Level) bool { return true }
func (l *logs) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logs) WithGroup(string) slog.Handler            { return l }
func (l *logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.msgs = append(l.msgs, r.Level.String()+" "+r.Message)
	l.mu.Unlock()
	return nil
}

func (l *logs) count(prefix string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			n++
		}
	}
	return n
}

// deadPool is a pool on a port nothing listens on: PostgreSQL down.
func deadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return poolAt(t, addr)
}

// hangingPool is a pool on a server that accepts connections and never
// answers: PostgreSQL hanging rather than refusing.
func hangingPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return poolAt(t, testenv.SilentServer(t))
}

func poolAt(t *testing.T, addr string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@"+addr+"/x?sslmode=disable&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// outcome is a finished request: completed with an answer, or failed
// with reason when reason is set.
func outcome(id string, attempts int, reason string) *job.Record {
	created := time.Now().Add(-time.Minute).Truncate(time.Millisecond)
	rec := &job.Record{Job: job.Job{ID: id, Tenant: "demo", Priority: priority.High, CaseID: "case-9",
		Route: llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}, CreatedAt: created},
		State: job.State{Attempts: attempts, StartedAt: created.Add(1500 * time.Millisecond), FinishedAt: created.Add(3 * time.Second)}}
	if reason != "" {
		rec.Status, rec.Code, rec.Reason = job.StatusFailed, job.CodeProviderError, reason
		return rec
	}
	rec.Status = job.StatusCompleted
	rec.State.ServedRoute = &llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
	rec.State.KeyID = "openai-gpt4o-1"
	rec.State.Result = &llm.Response{Content: []llm.Block{{Type: llm.BlockText, Text: "answer of " + id}},
		StopReason: llm.StopEndTurn, Usage: llm.Usage{InputTokens: 11, OutputTokens: 7}}
	return rec
}

// A submission row, then its outcome: every column the reports read.
// A late submission write never undoes the outcome.
func TestSubmittedThenFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testPool(t)
	s := history.New(pool, slog.New(slog.DiscardHandler), time.Minute)
	rec := outcome("req-1", 2, "")
	s.Submitted(ctx, &rec.Job, job.StatusQueued, "none")
	row, err := s.Get(ctx, "req-1")
	if err != nil || row.Status != job.StatusQueued || row.Tenant != "demo" || row.Priority != priority.High ||
		row.Route != rec.Job.Route || row.ServedRoute != nil || row.Response != nil || !row.CreatedAt.Equal(rec.Job.CreatedAt) {
		t.Fatalf("submitted row %+v, %v", row, err)
	}
	s.Finished(ctx, rec, 0.25)
	s.Submitted(ctx, &rec.Job, job.StatusQueued, "none") // e.g. a retried submission
	row, err = s.Get(ctx, "req-1")
	if err != nil || row.Status != job.StatusCompleted || row.ServedRoute == nil || *row.ServedRoute != *rec.State.ServedRoute ||
		row.Response == nil || row.Response.Text() != "answer of req-1" || row.Cached != "none" || row.Error != "" {
		t.Fatalf("finished row %+v, %v", row, err)
	}
	var keyID, caseID string
	var attempts, in, out int
	var cost float64
	var waitMS int64
	if err := pool.QueryRow(ctx, `SELECT key_id, case_id, attempts, input_tokens, output_tokens, cost_usd, queue_wait_ms
		FROM requests WHERE id = 'req-1'`).Scan(&keyID, &caseID, &attempts, &in, &out, &cost, &waitMS); err != nil {
		t.Fatal(err)
	}
	if keyID != "openai-gpt4o-1" || caseID != "case-9" || attempts != 2 || in != 11 || out != 7 || cost != 0.25 || waitMS != 1500 {
		t.Fatalf("key %s case %s attempts %d tokens %d/%d cost %v wait %dms", keyID, caseID, attempts, in, out, cost, waitMS)
	}
}

// An outcome without a submission row (PostgreSQL was down then) is
// inserted whole; a failure keeps the tenant's reason.
func TestFinishedWithoutSubmission(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Minute)
	s.Finished(ctx, outcome("req-f", 1, "provider_error: refused (request req-f)"), 0)
	row, err := s.Get(ctx, "req-f")
	if err != nil || row.Status != job.StatusFailed || row.Error != "provider_error: refused (request req-f)" ||
		row.Cached != "none" || row.ServedRoute != nil || row.Response != nil {
		t.Fatalf("row %+v, %v", row, err)
	}
	if _, err := s.Get(ctx, "req-unknown"); !errors.Is(err, history.ErrNotFound) {
		t.Fatalf("unknown id: %v, want ErrNotFound", err)
	}
}

// PostgreSQL down: writes fail open (counted, warned about once per
// interval); outcomes wait in the outbox, submissions do not; a replay
// while it is still down keeps every outcome, in order; once it is back,
// a replay from any process writes them all.
func TestOutboxWhilePostgresIsDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	key := "t:history:outbox"
	lg := &logs{}
	down := history.New(deadPool(t), slog.New(lg), time.Hour)
	down.Outbox(rdb, key, 10)
	var failures atomic.Int32
	down.OnError = func() { failures.Add(1) }

	down.Submitted(ctx, &outcome("req-a", 1, "").Job, job.StatusQueued, "none")
	down.Finished(ctx, outcome("req-a", 1, ""), 0.1)
	down.Finished(ctx, outcome("req-b", 1, "provider_error: x (request req-b)"), 0)
	if n, err := down.Backlog(ctx); err != nil || n != 2 {
		t.Fatalf("backlog %d (%v), want the 2 outcomes and not the submission", n, err)
	}
	if failures.Load() != 3 {
		t.Fatalf("%d failures counted, want 3", failures.Load())
	}
	if n := lg.count("WARN history: write failed"); n != 1 {
		t.Fatalf("%d warnings within one interval, want 1", n)
	}

	before := rdb.LRange(ctx, key, 0, -1).Val()
	if n, err := down.Replay(ctx); n != 0 || err == nil {
		t.Fatalf("replay while down = %d, %v; want 0 and an error", n, err)
	}
	if after := rdb.LRange(ctx, key, 0, -1).Val(); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Fatal("a failed replay changed the outbox or its order")
	}

	pool := testPool(t)
	up := history.New(pool, slog.New(slog.DiscardHandler), time.Hour)
	up.Outbox(rdb, key, 10)
	if n, err := up.Replay(ctx); n != 2 || err != nil {
		t.Fatalf("replay = %d, %v; want 2", n, err)
	}
	if n, _ := up.Backlog(ctx); n != 0 {
		t.Fatalf("backlog %d after the replay", n)
	}
	for id, want := range map[string]job.Status{"req-a": job.StatusCompleted, "req-b": job.StatusFailed} {
		if row, err := up.Get(ctx, id); err != nil || row.Status != want {
			t.Fatalf("%s: %+v, %v; want %s", id, row, err, want)
		}
	}
}

// Replay writes the oldest outcome first, across batches: of two outcomes
// of one request the newer wins.
func TestReplayOldestFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	down := history.New(deadPool(t), slog.New(slog.DiscardHandler), time.Hour)
	down.Outbox(rdb, "t:outbox", 1000)
	down.Finished(ctx, outcome("req-x", 1, ""), 0)
	for i := range 149 {
		down.Finished(ctx, outcome(fmt.Sprint("req-", i), 1, ""), 0)
	}
	down.Finished(ctx, outcome("req-x", 2, ""), 0)

	pool := testPool(t)
	up := history.New(pool, slog.New(slog.DiscardHandler), time.Hour)
	up.Outbox(rdb, "t:outbox", 1000)
	if n, err := up.Replay(ctx); n != 151 || err != nil {
		t.Fatalf("replay = %d, %v; want 151 over two batches", n, err)
	}
	var attempts, rows int
	if err := pool.QueryRow(ctx, "SELECT attempts, (SELECT count(*) FROM requests) FROM requests WHERE id = 'req-x'").
		Scan(&attempts, &rows); err != nil {
		t.Fatal(err)
	}
	if attempts != 2 || rows != 150 {
		t.Fatalf("req-x has %d attempts (want the newer outcome's 2), %d rows (want 150)", attempts, rows)
	}
}

// An outbox entry that can never be written (unreadable) is dropped and
// does not hold back the others. (Nothing the outbox's JSON can hold is
// refused by PostgreSQL any more: TestUnstorableTextIsEscaped.)
func TestReplaySkipsPoisonEntries(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	down := history.New(deadPool(t), slog.New(slog.DiscardHandler), time.Hour)
	down.Outbox(rdb, "t:outbox", 10)
	if err := rdb.LPush(ctx, "t:outbox", "{not json").Err(); err != nil {
		t.Fatal(err)
	}
	nul := outcome("req-nul", 1, "")
	nul.State.Result.Content[0].Text = "a\x00b"
	down.Finished(ctx, nul, 0)
	down.Finished(ctx, outcome("req-good", 1, ""), 0)

	up := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	up.Outbox(rdb, "t:outbox", 10)
	var dropped atomic.Int32
	up.OnDrop = func() { dropped.Add(1) }
	if n, err := up.Replay(ctx); err != nil || n != 2 {
		t.Fatalf("replay wrote %d (%v), want 2: the unreadable entry is not written", n, err)
	}
	if n, _ := up.Backlog(ctx); n != 0 {
		t.Fatalf("%d entries left: a poison entry blocks the outbox", n)
	}
	for _, id := range []string{"req-good", "req-nul"} {
		if row, err := up.Get(ctx, id); err != nil || row.Status != job.StatusCompleted {
			t.Fatalf("%s behind the poison: %+v, %v", id, row, err)
		}
	}
	if dropped.Load() != 1 {
		t.Fatalf("%d outcomes counted as lost, want the unreadable one", dropped.Load())
	}
}

// A full outbox drops (and counts) what does not fit; without an outbox a
// failed outcome is only counted, and Backlog and Replay are no-ops.
func TestOutboxBounds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	full := history.New(deadPool(t), slog.New(slog.DiscardHandler), time.Hour)
	full.Outbox(rdb, "t:outbox", 2)
	var dropped atomic.Int32
	full.OnDrop = func() { dropped.Add(1) }
	for i := range 3 {
		full.Finished(ctx, outcome(fmt.Sprint("req-", i), 1, ""), 0)
	}
	if n, err := full.Backlog(ctx); n != 2 || err != nil || dropped.Load() != 1 {
		t.Fatalf("backlog %d (%v), dropped %d; want 2 kept and 1 dropped", n, err, dropped.Load())
	}

	bare := history.New(deadPool(t), slog.New(slog.DiscardHandler), time.Hour)
	var failures atomic.Int32
	bare.OnError = func() { failures.Add(1) }
	bare.Finished(ctx, outcome("req-z", 1, ""), 0)
	if failures.Load() != 1 {
		t.Fatal("a failed write without an outbox was not counted")
	}
	if n, err := bare.Backlog(ctx); n != 0 || err != nil {
		t.Fatalf("backlog without an outbox: %d, %v", n, err)
	}
	if n, err := bare.Replay(ctx); n != 0 || err != nil {
		t.Fatalf("replay without an outbox: %d, %v", n, err)
	}
}

// With PostgreSQL hanging rather than refusing, a submission gives up
// quickly instead of adding seconds to the request.
func TestSubmittedDoesNotWaitForAHangingDatabase(t *testing.T) {
	t.Parallel()
	s := history.New(hangingPool(t), slog.New(slog.DiscardHandler), time.Hour)
	var failures atomic.Int32
	s.OnError = func() { failures.Add(1) }
	start := time.Now()
	s.Submitted(context.Background(), &outcome("req-h", 0, "").Job, job.StatusQueued, "none")
	if d := time.Since(start); d > 2*time.Second || failures.Load() != 1 {
		t.Fatalf("Submitted took %s (failures %d); want it to give up within about 300ms", d, failures.Load())
	}
}

// An outcome kept through an outage holds what its row needs, not the
// request (a prompt of 100 KB stays out of the outbox), and counts against
// its tenant until a replay writes it.
func TestOutboxKeepsRowsCountedPerTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rdb := testenv.Redis(t)
	down := history.New(deadPool(t), slog.New(slog.DiscardHandler), time.Hour)
	down.Outbox(rdb, "t:outbox", 100)
	big := outcome("req-big", 1, "")
	big.Job.Request = llm.Request{Messages: []llm.Message{{Role: llm.RoleUser,
		Content: []llm.Block{{Type: llm.BlockText, Text: strings.Repeat("<log line>", 10_000)}}}}}
	down.Finished(ctx, big, 0)
	other := outcome("req-other", 1, "")
	other.Job.Tenant = "other"
	down.Finished(ctx, other, 0)

	entries := rdb.LRange(ctx, "t:outbox", 0, -1).Val()
	if len(entries) != 2 || len(entries[1]) > 2000 {
		t.Fatalf("outbox holds %d entries, the first of %d bytes; want 2 rows of well under 2 KB", len(entries), len(entries[1]))
	}
	held, err := down.HeldBy(ctx)
	if err != nil || held["demo"] != int64(len(entries[1])) || held["other"] != int64(len(entries[0])) {
		t.Fatalf("held %v (%v); entries of %d and %d bytes", held, err, len(entries[1]), len(entries[0]))
	}

	up := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	up.Outbox(rdb, "t:outbox", 100)
	if n, err := up.Replay(ctx); n != 2 || err != nil {
		t.Fatalf("replay = %d, %v", n, err)
	}
	if held, err := up.HeldBy(ctx); err != nil || len(held) != 0 {
		t.Fatalf("after the replay the tenants still hold %v (%v)", held, err)
	}
	if row, err := up.Get(ctx, "req-big"); err != nil || row.Status != job.StatusCompleted || row.Response == nil {
		t.Fatalf("row %+v, %v", row, err)
	}
}
