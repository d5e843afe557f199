package history_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"bulwark/pkg/history"
	"bulwark/pkg/job"
	"bulwark/pkg/testkit/testenv"
)

// With the writer running, submissions and outcomes written from many
// goroutines all reach PostgreSQL by Close, each outcome after its
// submission; a row PostgreSQL refuses (a finish time before its
// timestamps) costs only itself,
// not the batch it was in; and writes after Close are synchronous again.
func TestWriterBatchesWithoutLoss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	var dropped atomic.Int32
	s.OnDrop = func() { dropped.Add(1) }
	s.Outbox(testenv.Redis(t), "t:outbox", 10)
	s.Start()
	const n = 300
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := outcome(fmt.Sprintf("req-w%d", i), 1, "")
			if i == 7 {
				rec.State.FinishedAt = time.Date(-10000, 1, 1, 0, 0, 0, 0, time.UTC) // before PostgreSQL's timestamps
			}
			s.Submitted(ctx, &rec.Job, job.StatusQueued, "none")
			s.Finished(ctx, rec, 0.5)
		})
	}
	wg.Wait()
	s.Close()
	for i := range n {
		row, err := s.Get(ctx, fmt.Sprintf("req-w%d", i))
		if i == 7 {
			if err != nil || row.Status != job.StatusQueued {
				t.Fatalf("the refused outcome's row: %+v %v, want its submission only", row, err)
			}
			continue
		}
		if err != nil || row.Status != job.StatusCompleted || row.Response == nil {
			t.Fatalf("row %d after Close: %+v %v", i, row, err)
		}
	}
	if dropped.Load() != 1 {
		t.Fatalf("%d outcomes counted lost, want the refused one", dropped.Load())
	}
	after := outcome("req-after", 1, "")
	s.Finished(ctx, after, 0)
	if _, err := s.Get(ctx, "req-after"); err != nil {
		t.Fatalf("a write after Close: %v", err)
	}
	s.Close() // twice is fine
	if _, err := s.Get(ctx, "req-none"); !errors.Is(err, history.ErrNotFound) {
		t.Fatal(err)
	}
}

// stallProxy forwards TCP to target; while stalled it holds what clients
// send (PostgreSQL too slow to answer).
type stallProxy struct {
	ln      net.Listener
	target  string
	stalled atomic.Bool
	closed  atomic.Bool
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			wg.Go(func() { io.Copy(c, s); c.Close() })
			wg.Go(func() {
				defer s.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					for p.stalled.Load() && !p.closed.Load() {
						time.Sleep(5 * time.Millisecond)
					}
					if n > 0 {
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	t.Cleanup(func() {
		p.closed.Store(true)
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

// With PostgreSQL stalled at shutdown, Close returns within its bound as
// a whole (not batchTimeout per batch: 4 batches here would take 20 s),
// and every queued outcome waits in the outbox; a replay once PostgreSQL
// answers again writes them all.
func TestCloseIsBoundedAgainstASlowPostgres(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	px := newStallProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = "127.0.0.1", uint16(px.ln.Addr().(*net.TCPAddr).Port)
	slow, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close)
	if err := slow.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := testenv.Redis(t)
	s := history.New(slow, slog.New(slog.DiscardHandler), time.Hour)
	s.Outbox(rdb, "t:outbox", 10_000)
	var dropped atomic.Int32
	s.OnDrop = func() { dropped.Add(1) }
	s.FlushTimeout = 500 * time.Millisecond
	s.Start()
	px.stalled.Store(true)
	const n = 1000
	for i := range n {
		s.Finished(ctx, outcome(fmt.Sprintf("req-s%d", i), 1, ""), 0)
	}
	start := time.Now()
	s.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %s against a stalled PostgreSQL, want about its 500ms bound", d)
	}
	if got, err := s.Backlog(ctx); err != nil || got != n || dropped.Load() != 0 {
		t.Fatalf("outbox holds %d (%v), %d dropped; want all %d outcomes kept", got, err, dropped.Load(), n)
	}

	px.stalled.Store(false)
	up := history.New(testPool(t), slog.New(slog.DiscardHandler), time.Hour)
	up.Outbox(rdb, "t:outbox", 10_000)
	if w, err := up.Replay(ctx); err != nil || w != n {
		t.Fatalf("replay wrote %d, %v; want %d", w, err, n)
	}
	for i := range n {
		if row, err := up.Get(ctx, fmt.Sprintf("req-s%d", i)); err != nil || row.Status != job.StatusCompleted {
			t.Fatalf("req-s%d after the replay: %+v, %v", i, row, err)
		}
	}
}
