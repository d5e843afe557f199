package storm

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// Out-of-order starts: only pairs accepted more than AcceptGap apart count, a
// later one must start more than OvertakeGap earlier, and a request that
// never started counts from its end (or now).
func TestOvertakes(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	row := func(id string, created, started float64) historyRow {
		r := historyRow{id: id, created: at(created)}
		if started >= 0 {
			r.started = at(started)
		}
		return r
	}
	tests := []struct {
		name              string
		rows              []historyRow
		pairs, n          int
		worst             time.Duration
		nowAfterFirstSecs float64
	}{
		{"in order", []historyRow{row("a", 0, 1), row("b", 0.3, 1.2), row("c", 0.6, 1.3)}, 3, 0, 0, 10},
		{"within the gap", []historyRow{row("a", 0, 2), row("b", 0.3, 1.1)}, 1, 0, 0, 10},
		{"overtaken by 3 s", []historyRow{row("a", 0, 5), row("b", 0.3, 2), row("c", 0.6, 4.5)}, 3, 1, 3 * time.Second, 10},
		{"same acceptance time", []historyRow{row("a", 0, 5), row("b", 0, 1)}, 0, 0, 0, 10},
		{"accepted within 250 ms", []historyRow{row("a", 0, 5), row("b", 0.25, 1)}, 0, 0, 0, 10},
		{"never started, ended", []historyRow{{id: "a", created: at(0), finished: at(30)}, row("b", 1, 2)}, 1, 1, 28 * time.Second, 40},
		{"never started, open", []historyRow{row("a", 0, -1), row("b", 1, 2)}, 1, 1, 38 * time.Second, 40},
	}
	for _, tt := range tests {
		pairs, n, worst := overtakes(tt.rows, at(tt.nowAfterFirstSecs))
		if pairs != tt.pairs || n != tt.n || worst != tt.worst {
			t.Errorf("%s: pairs %d, overtakes %d, worst %s; want %d, %d, %s", tt.name, pairs, n, worst, tt.pairs, tt.n, tt.worst)
		}
	}
}

// fleetMeasure: end-to-end and queue waits per priority, the LOW wait
// against clients ÷ capacity, CRITICAL over its own call, and missing
// history rows.
func TestFleetMeasure(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	prompts := []string{"p0", "p1", "p2", "p3", "p4"}
	outcomes := []outcome{
		{sent: true, ok: true, prio: "critical", id: "r0", sentAt: at(0), doneAt: at(1), endedAt: at(1)},
		{sent: true, ok: true, prio: "low", id: "r1", sentAt: at(0), doneAt: at(7), endedAt: at(7)},
		{sent: true, ok: true, prio: "low", id: "r2", sentAt: at(0.5), doneAt: at(4), endedAt: at(4)},
		{sent: true, prio: "low", id: "r3", sentAt: at(1), reason: "failed:deadline_exceeded", endedAt: at(9)},
		{sent: true, prio: "low", id: "r4", sentAt: at(1), reason: "cut", endedAt: at(20)}, // not ended: no e2e
	}
	rows := map[string]historyRow{
		"r0": {id: "r0", priority: "critical", route: "openai/gpt4o-mini", status: "completed", created: at(0), started: at(0.1), finished: at(1)},
		"r1": {id: "r1", priority: "low", route: "openai/gpt4o-mini", status: "completed", created: at(0), started: at(6), finished: at(7)},
		"r2": {id: "r2", priority: "low", route: "openai/gpt4o-mini", status: "completed", created: at(0.5), started: at(3), finished: at(4)},
		"r3": {id: "r3", priority: "low", route: "openai/gpt4o-mini", status: "failed", created: at(1), finished: at(9)},
		// r4 has no row
	}
	calls := []providerCall{
		{Prompt: "p0", Status: http.StatusTooManyRequests, Start: at(0.1), End: at(0.15)},
		{Prompt: "p0", Status: http.StatusOK, Start: at(0.6), End: at(0.9)},
	}
	fs := fleetMeasure(outcomes, prompts, rows, calls, 2, 0.5, at(30))
	if fs.IdealWait != 4*time.Second {
		t.Errorf("ideal wait %s, want 4s (2 clients ÷ 0.5/s)", fs.IdealWait)
	}
	crit, low := fs.ByPriority["critical"], fs.ByPriority["low"]
	if crit.Ended != 1 || crit.E2EP99 != time.Second || crit.Waits != 1 || crit.WaitP99 != 100*time.Millisecond {
		t.Errorf("critical %+v", crit)
	}
	if fs.CriticalCalls != 1 || fs.CriticalOverCall != 700*time.Millisecond {
		t.Errorf("critical over its call %s (n=%d), want 0.7s (1 s minus the 0.3 s answered call)", fs.CriticalOverCall, fs.CriticalCalls)
	}
	// LOW waits: 6 s, 2.5 s, and r3 never started: 8 s until its end.
	if low.Ended != 3 || low.E2EP50 != 7*time.Second || low.Waits != 3 || low.WaitP50 != 6*time.Second || low.WaitP99 != 8*time.Second ||
		low.WaitMax != 8*time.Second || low.E2EMax != 8*time.Second {
		t.Errorf("low %+v", low)
	}
	if fs.LowWaitRatio != 2 {
		t.Errorf("LOW wait ratio %g, want 2 (8 s ÷ 4 s)", fs.LowWaitRatio)
	}
	// r2 (accepted 0.5 s after r1) started 3 s before it.
	if low.Pairs != 3 || low.Overtakes != 1 || low.WorstOvertake != 3*time.Second {
		t.Errorf("low order: %d pairs, %d overtakes, worst %s", low.Pairs, low.Overtakes, low.WorstOvertake)
	}
	// By first provider call: r0's call at 0.1 s; no LOW request called.
	if low.CallOvertakes != 1 || crit.CallOvertakes != 0 || fs.LowE2ERatio != 2 { // 8 s (r3 failed at 8 s) ÷ 4 s
		t.Errorf("call order: low %d, critical %d; LOW e2e ratio %g", low.CallOvertakes, crit.CallOvertakes, fs.LowE2ERatio)
	}
	if fs.HistoryMissing != 1 {
		t.Errorf("history missing %d, want 1 (r4)", fs.HistoryMissing)
	}

	sc, _ := NewScenario("F1-fleet-async", 400, 50, 0)
	m := fs.misses(sc.Targets)
	if len(m) != 4 { // missing row, LOW ratio, LOW overtake, CRITICAL over its call
		t.Errorf("misses: %d %q, want 4", len(m), m)
	}
	good := FleetStats{IdealWait: 6250 * time.Millisecond, LowWaitRatio: 1.1, CriticalCalls: 20, CriticalOverCall: 200 * time.Millisecond,
		ByPriority: map[string]PriorityStats{"low": {Waits: 380, WaitP99: 6 * time.Second, Pairs: 70000}, "critical": {Waits: 20, Pairs: 190}}}
	if m := good.misses(sc.Targets); len(m) != 0 {
		t.Errorf("misses of a good fleet: %q", m)
	}
	if m := (Result{Total: 400, Answered: 400, Goodput: 1, CallsPerRequest: 1, ETA: ErrorStats{N: 1}, ETAFirst: ErrorStats{N: 1}}).Misses(sc.Targets); len(m) != 1 ||
		!strings.Contains(m[0], "no fleet measures") {
		t.Errorf("a fleet scenario without its measures: %q", m)
	}
}

// Estimates of a request that never started count against the wait
// until its end.
func TestStarvedEstimates(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	outcomes := []outcome{
		{sent: true, ok: true, sentAt: t0, doneAt: t0.Add(3 * time.Second), endedAt: t0.Add(3 * time.Second),
			estimates: []estimate{{value: 2 * time.Second, at: t0, first: true, real: 2 * time.Second, resolved: true}}},
		{sent: true, reason: "cut", sentAt: t0, endedAt: t0.Add(10 * time.Second),
			estimates: []estimate{{value: 5 * time.Second, at: t0, first: true}}},
		// An estimate after the request's start: nothing remained to wait.
		{sent: true, ok: true, sentAt: t0, startedAt: t0.Add(time.Second), doneAt: t0.Add(2 * time.Second), endedAt: t0.Add(2 * time.Second),
			estimates: []estimate{{value: 1500 * time.Millisecond, at: t0.Add(1100 * time.Millisecond), first: true}}},
	}
	var r Result
	r.summarise(outcomes, []string{"a", "b", "c"}, 8)
	if r.ETAStarved != 1 || r.ETALate != 1 || r.ETAFirst.N != 3 || r.ETAFirst.P50 != 0.5 || r.ETAFirst.P95 != 1.5 || r.ETAAbs.P95 != 5*time.Second {
		t.Errorf("starved %d, late %d, first %+v, abs %+v; want 1, 1, n=3 p50=0.5 p95=1.5, p95=5s", r.ETAStarved, r.ETALate, r.ETAFirst, r.ETAAbs)
	}
}
