package storm

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/job"
)

// PostgreSQL holds the cache and the history only: the live state is in
// Redis. With PostgreSQL away the API must keep serving — requests run,
// cache and history bypassed — and say so on /readyz without leaving a
// load balancer's rotation; once it is back, the history rows whose write
// failed meanwhile must be written after all.
const (
	// pgReadyBackWithin: /readyz says postgres ok, nothing degraded,
	// this long after the server is back at the latest (the processes
	// retry their migrations every 5 s).
	pgReadyBackWithin = 30 * time.Second
	// pgHistoryWithin: every accepted request has a terminal history row
	// this long after the server is back.
	pgHistoryWithin = 60 * time.Second
	// pgDegradedGrace: after the server stops, /readyz may say ok this
	// long (a check in flight); after it, it must say degraded.
	pgDegradedGrace = 5 * time.Second
)

// TestFaultPostgres runs the system on a PostgreSQL server of its own and
// takes it away: down when the processes start, then stopped mid-storm.
func TestFaultPostgres(t *testing.T) {
	t.Parallel()
	t.Run("down-at-start", testPostgresDownAtStart)
	t.Run("stopped-mid-run", testPostgresStopped)
}

// testPostgresDownAtStart: PostgreSQL is stopped before the api and
// workers start. They must start anyway, /readyz must answer 200 with
// "degraded": ["postgres"], and requests must complete. Once 30 of a
// batch of 60 have ended, PostgreSQL starts: every request completes,
// /readyz is healthy within 30 s and the history rows are written within
// 60 s. Recovery: from PostgreSQL back to /readyz healthy.
func testPostgresDownAtStart(t *testing.T) {
	t.Parallel()
	const endedWhileDown = 30
	sc := faultScenario("F-pg-down-at-start", 60, 300*time.Millisecond, 100*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 2, OwnPostgres: true, PostgresDown: true}, 0)
	ctx := t.Context()
	var problems []string

	atStart, err := readyz(ctx, f.client, f.sys.apiURL)
	if err != nil || !atStart.degradedWithout("postgres") {
		problems = append(problems, fmt.Sprintf("/readyz with PostgreSQL down at start-up: %s (err %v); want HTTP 200 "+
			`{"ready": true, "degraded": ["postgres"], "checks": {"redis": "ok", "postgres": "down"}}`, atStart, err))
	}

	f.start(ctx, 150*time.Second)
	// Requests must end without PostgreSQL; if they do not, it starts
	// anyway after a minute, to see whether they do once it is back.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	if err := f.awaitEnded(wctx, endedWhileDown); err != nil {
		problems = append(problems, fmt.Sprintf("fewer than %d of %d requests ended within a minute with PostgreSQL down: %v",
			endedWhileDown, sc.Requests, err))
	}
	cancel()
	whileDown := f.readyzWhile(ctx, nil) // one look, under load
	b := f.postgresBack(t)
	up, back, hist, res := b.up, b.back, b.hist, b.res
	problems = append(problems, b.problems...)
	problems = append(problems, whileDown.problems()...)
	problems = append(problems, hist.problems()...)
	res.Notes = fmt.Sprintf("pg_started_at=+%.1fs completed_before_pg_started=%d readyz_at_start=%q readyz_back=%q %s",
		up.Sub(f.began).Seconds(), f.completedBefore(up), atStart.String(), back.String(), hist)
	finish(t, f, res, problems)
}

// testPostgresStopped: once 30 of a storm of 150 requests have ended,
// PostgreSQL stops (fast shutdown) for 20 s, then starts again. Every
// request must complete; /readyz must answer 200 with "degraded":
// ["postgres"] while it is away, be healthy within 30 s of its return,
// and the history rows must be written within 60 s of it. Recovery: from
// PostgreSQL back to /readyz healthy.
func testPostgresStopped(t *testing.T) {
	t.Parallel()
	const outage, endedBefore = 20 * time.Second, 30
	sc := faultScenario("F-pg-stopped", 150, 300*time.Millisecond, 100*time.Millisecond)
	f := setupFault(t, sc, options{Workers: 2, OwnPostgres: true}, 0)
	ctx := t.Context()
	var problems []string

	before, err := readyz(ctx, f.client, f.sys.apiURL)
	if err != nil || !before.healthy() {
		problems = append(problems, fmt.Sprintf("/readyz before the outage: %s (err %v); want healthy", before, err))
	}
	f.start(ctx, 180*time.Second)
	if err := f.awaitEnded(ctx, endedBefore); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	if err := f.sys.stopPostgres(); err != nil {
		t.Fatalf("stopping PostgreSQL: %v", err)
	}
	// The outage lasts its time even if the storm ends first: /readyz is
	// watched for all of it.
	octx, cancel := context.WithTimeout(ctx, outage)
	during := f.readyzWhile(octx, func(at time.Time) bool { return at.Sub(down) < pgDegradedGrace })
	cancel()
	b := f.postgresBack(t)
	up, back, hist, res := b.up, b.back, b.hist, b.res
	problems = append(problems, b.problems...)
	problems = append(problems, during.problems()...)
	problems = append(problems, hist.problems()...)
	res.Notes = fmt.Sprintf("outage=+%.1fs..+%.1fs completed_during_outage=%d readyz_during_outage={%s} readyz_back=%q %s",
		down.Sub(f.began).Seconds(), up.Sub(f.began).Seconds(), f.completedBetween(down, up), during, back.String(), hist)
	finish(t, f, res, problems)
}

// pgBack is what followed PostgreSQL's return.
type pgBack struct {
	up       time.Time // when it was started again
	back     readiness // /readyz once healthy, or its last answer
	hist     historyCheck
	res      FaultResult // recovery: PostgreSQL back → /readyz healthy
	problems []string
}

// postgresBack starts PostgreSQL again, then waits for /readyz to be
// healthy, the load to end and the history rows to be written, and
// verifies the load.
func (f *faultRun) postgresBack(t *testing.T) pgBack {
	t.Helper()
	ctx := t.Context()
	if err := f.sys.startPostgres(ctx); err != nil {
		t.Fatalf("starting PostgreSQL: %v", err)
	}
	b := pgBack{up: time.Now()}
	back, backAt, rerr := awaitReadyz(ctx, f.client, f.sys.apiURL, pgReadyBackWithin, readiness.healthy)
	b.back = back
	cut := f.wait(ctx)
	f.verify(verifyCtx(t))
	b.hist = f.awaitHistory(ctx, b.up, pgHistoryWithin)
	b.res, b.problems = f.result(t.Name(), nil)
	b.res.RecoveryWhat = "postgres back→/readyz healthy"
	if rerr != nil {
		b.problems = append(b.problems, fmt.Sprintf("/readyz after PostgreSQL came back: %v; want HTTP 200 "+
			`{"ready": true, "checks": {"postgres": "ok", "redis": "ok"}} without "degraded"`, rerr))
	} else {
		b.res.Recovery = []time.Duration{backAt.Sub(b.up)}
	}
	if cut != nil {
		b.problems = append(b.problems, fmt.Sprintf("the load was cut: %v", cut))
	}
	return b
}

// readyzSeen is what /readyz answered while PostgreSQL was away.
type readyzSeen struct {
	counts map[string]int // degraded, ok_in_grace, wrong, error
	wrong  []string       // the first wrong answers or errors, with when
}

// readyzWhile polls /readyz every 250 ms until ctx ends — or once, when
// ctx is already over or graceful is nil — and sorts every answer: the
// API degraded without postgres (right), still healthy while graceful(at)
// (a check in flight when it stopped), or anything else (wrong).
func (f *faultRun) readyzWhile(ctx context.Context, graceful func(at time.Time) bool) readyzSeen {
	seen := readyzSeen{counts: map[string]int{}}
	for {
		// Each look gets its own time, so that the last one is not cut
		// short by the end of the outage.
		r, err := readyz(context.WithoutCancel(ctx), f.client, f.sys.apiURL)
		at := time.Now()
		kind := "degraded"
		switch {
		case err != nil:
			kind = "error"
		case r.degradedWithout("postgres"):
		case graceful != nil && graceful(at) && r.healthy():
			kind = "ok_in_grace"
		default:
			kind = "wrong"
		}
		seen.counts[kind]++
		if (kind == "wrong" || kind == "error") && len(seen.wrong) < 5 {
			seen.wrong = append(seen.wrong, fmt.Sprintf("at +%.1fs: %s (err %v)", at.Sub(f.began).Seconds(), r, err))
		}
		if graceful == nil || !sleep(ctx, 250*time.Millisecond) {
			return seen
		}
	}
}

func (s readyzSeen) String() string { return countsText(s.counts) }

func (s readyzSeen) problems() []string {
	var out []string
	if n := s.counts["wrong"] + s.counts["error"]; n > 0 {
		out = append(out, fmt.Sprintf("/readyz with PostgreSQL down: %d of %d answers were not HTTP 200 "+
			`{"ready": true, "degraded": ["postgres"], "checks": {"postgres": "down", "redis": "ok"}}: %s`,
			n, s.total(), strings.Join(s.wrong, "; ")))
	}
	if s.counts["degraded"] == 0 {
		out = append(out, "/readyz never said postgres degraded while PostgreSQL was down")
	}
	return out
}

func (s readyzSeen) total() int {
	n := 0
	for _, c := range s.counts {
		n += c
	}
	return n
}

// historyCheck is what the requests table held for the accepted requests
// the last time it was read.
type historyCheck struct {
	accepted, terminal int
	missing            []string      // "id (its row's status, or no row)"
	after              time.Duration // since PostgreSQL came back
	within             time.Duration
	err                error
}

// awaitHistory reads the requests table every second until every
// accepted request has a terminal row there, or until within after up.
func (f *faultRun) awaitHistory(ctx context.Context, up time.Time, within time.Duration) historyCheck {
	var ids []string
	for i := range f.reqs {
		if id := f.reqs[i].id; id != "" {
			ids = append(ids, id)
		}
	}
	h := historyCheck{accepted: len(ids), within: within}
	ctx, cancel := context.WithDeadline(ctx, up.Add(within))
	defer cancel()
	for {
		rows, err := historyStatuses(ctx, f.sys.databaseDSN(), ids)
		h.after, h.err = time.Since(up), err
		if err == nil {
			h.terminal, h.missing = 0, nil
			for _, id := range ids {
				st, ok := rows[id]
				switch {
				case ok && job.Status(st).Terminal():
					h.terminal++
				case ok:
					h.missing = append(h.missing, id+" ("+st+")")
				default:
					h.missing = append(h.missing, id+" (no row)")
				}
			}
			if len(h.missing) == 0 {
				return h
			}
		}
		if !sleep(ctx, time.Second) {
			return h
		}
	}
}

func (h historyCheck) String() string {
	return fmt.Sprintf("history_rows_terminal=%d/%d(at %.1fs after postgres back)", h.terminal, h.accepted, h.after.Seconds())
}

func (h historyCheck) problems() []string {
	if h.err != nil && h.terminal == 0 {
		return []string{fmt.Sprintf("history rows unreadable %.0fs after PostgreSQL came back: %v", h.after.Seconds(), h.err)}
	}
	if len(h.missing) == 0 {
		return nil
	}
	shown := h.missing[:min(len(h.missing), 10)]
	return []string{fmt.Sprintf("history rows missing for %d requests: %d of %d accepted requests have a terminal row "+
		"(completed/failed/cancelled) in the requests table %.0fs after PostgreSQL came back (want all within %s: "+
		"the writes that failed while it was down must be caught up); e.g. %s",
		len(h.missing), h.terminal, h.accepted, h.after.Seconds(), h.within, strings.Join(shown, ", "))}
}

// completedBefore counts the requests whose client saw them complete
// before t.
func (f *faultRun) completedBefore(t time.Time) int { return f.completedBetween(f.began, t) }

// completedBetween counts the requests whose client saw them complete
// between from and to.
func (f *faultRun) completedBetween(from, to time.Time) int {
	n := 0
	for i := range f.reqs {
		r := &f.reqs[i]
		if r.o.ok && !r.endAt.Before(from) && r.endAt.Before(to) {
			n++
		}
	}
	return n
}
