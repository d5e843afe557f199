package storm

// The fleet scenarios (F1-fleet-async, F1-fleet-compat) measure what a
// waiting caller sees, per priority: the driver's clients already form a
// closed loop (each sends its next request when its last one ended), and
// these scenarios add what a report of the wait for a slot alone cannot
// see — the whole time until the answer, the order in which requests of
// one priority really started, and how far off every ETA was.

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"bulwark/pkg/priority"
)

// OvertakeGap is how much earlier a request must start than one of the
// same priority and route accepted before it to count as an out-of-order
// start (Targets.NoOvertakes).
const OvertakeGap = time.Second

// AcceptGap is how much earlier a request must have been accepted than
// another for their start order to count (issue 25: "a request never
// starts after a request of the same priority and route that was accepted
// more than 250 ms later"). Requests a storm's first burst sends within
// the same few milliseconds are not ordered by it.
const AcceptGap = 250 * time.Millisecond

// historyWait bounds the wait, after the load, for the history rows of
// the requests that ended to be written (the writes are batched).
const historyWait = 20 * time.Second

// historyRow is the part of a requests row the fleet measures read.
type historyRow struct {
	id       string
	priority string // "critical" … "low"
	route    string // the route asked, "provider/tier"
	status   string
	created  time.Time
	started  time.Time // zero: never started
	finished time.Time // zero: not ended (or not written yet)
}

// terminal reports whether the row records the request's end.
func (h historyRow) terminal() bool {
	return h.status == "completed" || h.status == "failed" || h.status == "cancelled"
}

// readHistory reads the history rows of ids from the database at dsn,
// reading again (for up to historyWait) until every id in ended has a
// terminal row. It returns what it read when the time is up.
func readHistory(ctx context.Context, dsn string, ids, ended []string) (map[string]historyRow, error) {
	ctx, cancel := context.WithTimeout(ctx, historyWait+10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("storm: read history: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	deadline := time.Now().Add(historyWait)
	for {
		rows, err := queryHistory(ctx, conn, ids)
		if err != nil {
			return nil, err
		}
		complete := true
		for _, id := range ended {
			if r, ok := rows[id]; !ok || !r.terminal() {
				complete = false
				break
			}
		}
		if complete || time.Now().After(deadline) {
			return rows, nil
		}
		if !sleep(ctx, 250*time.Millisecond) {
			return rows, nil
		}
	}
}

func queryHistory(ctx context.Context, conn *pgx.Conn, ids []string) (map[string]historyRow, error) {
	rows, err := conn.Query(ctx, `SELECT id, priority, provider, model_tier, status, created_at, started_at, finished_at
		FROM requests WHERE id = ANY($1)`, ids)
	if err != nil {
		return nil, fmt.Errorf("storm: read history: %w", err)
	}
	out := make(map[string]historyRow, len(ids))
	var (
		id, provider, tier, status string
		prio                       int
		created                    time.Time
		started, finished          *time.Time
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &prio, &provider, &tier, &status, &created, &started, &finished}, func() error {
		r := historyRow{id: id, priority: priority.Priority(prio).String(), route: provider + "/" + tier, status: status, created: created}
		if started != nil {
			r.started = *started
		}
		if finished != nil {
			r.finished = *finished
		}
		out[id] = r
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("storm: read history: %w", err)
	}
	return out, nil
}

// fleetResult reads the history rows of the requests Bulwark accepted
// from the scenario's database at dsn and computes the fleet measures.
func fleetResult(ctx context.Context, dsn string, outcomes []outcome, prompts []string, calls []providerCall, sc Scenario) *FleetStats {
	var ids, ended []string
	for _, o := range outcomes {
		if o.id == "" {
			continue
		}
		ids = append(ids, o.id)
		if o.ended() {
			ended = append(ended, o.id)
		}
	}
	rows, err := readHistory(context.WithoutCancel(ctx), dsn, ids, ended)
	fs := fleetMeasure(outcomes, prompts, rows, calls, sc.Clients, sc.capacity(), time.Now())
	if err != nil {
		fs.HistoryErr = firstLine(err)
	}
	return &fs
}

// PriorityStats is what the callers of one priority saw (fleet scenarios).
type PriorityStats struct {
	// Ended counts the requests that ended at the client (answered or
	// failed; not those cut at the time limit), with E2EP50 and E2EP99 of
	// their submit → answer (or failure) as the client timed it, E2EMax
	// the longest.
	Ended                  int
	E2EP50, E2EP99, E2EMax time.Duration
	// Waits counts the requests with a history row, with WaitP50 and
	// WaitP99 of created_at → started_at; a request that never started
	// counts its wait until its end (or until history was read): a lower
	// bound, so a starved request is never left out. WaitMax is the
	// longest.
	Waits                     int
	WaitP50, WaitP99, WaitMax time.Duration
	// Pairs counts the pairs of requests of this priority and one route
	// with distinct acceptance times; Overtakes those where the one
	// accepted later started more than OvertakeGap before the other,
	// WorstOvertake the largest such gap.
	Pairs, Overtakes int
	WorstOvertake    time.Duration
	// CallOvertakes and WorstCallOvertake are the same count over the
	// start of each request's first provider call (the recording
	// proxy's) instead of started_at: a request that took its slot in
	// order can still be overtaken at the key pool. Not a target; shown
	// beside it.
	CallOvertakes     int
	WorstCallOvertake time.Duration
}

// FleetStats is what a fleet scenario measures besides Result's totals.
type FleetStats struct {
	// ByPriority is keyed by priority name ("critical", "low").
	ByPriority map[string]PriorityStats
	// IdealWait is the first-come-first-served wait of a closed loop of
	// C clients on keys serving capacity requests/s: C ÷ capacity.
	// LowWaitRatio is LOW's WaitP99 ÷ IdealWait (0 without LOW waits);
	// LowE2ERatio LOW's E2EP99 ÷ IdealWait, which C ÷ capacity also
	// bounds in a closed loop served in order (shown, not a target).
	IdealWait                 time.Duration
	LowWaitRatio, LowE2ERatio float64
	// CriticalOverCall is the p99, over the answered CRITICAL requests
	// whose provider call the recording proxy saw, of end-to-end latency
	// minus that call's own duration; CriticalCalls counts them.
	CriticalOverCall time.Duration
	CriticalCalls    int
	// CriticalBeforeCall and CriticalAfterCall split it: the p50 and p99
	// of submit → the answered call's start, and of that call's end → the
	// answer at the client (where the extra time goes).
	CriticalBeforeCall, CriticalAfterCall [2]time.Duration
	// CriticalSteps splits the time before the call further, p50 and p99
	// of each: submit → accepted (history created_at), accepted → slot
	// (started_at), slot → the answered call's start (the key line).
	CriticalSteps [3][2]time.Duration
	// HistoryMissing counts the requests Bulwark accepted (an id came
	// back) that have no history row; HistoryErr says why history could
	// not be read at all.
	HistoryMissing int
	HistoryErr     string
}

// fleetMeasure computes the fleet measures from the clients' outcomes,
// history's rows (by request id), the provider calls the recording proxy
// saw (each prompt's answered call), the clients and the keys' capacity
// (requests/s); now ends the wait of a request that never started and
// whose row has no end.
func fleetMeasure(outcomes []outcome, prompts []string, rows map[string]historyRow, calls []providerCall,
	clients int, capacity float64, now time.Time) FleetStats {
	fs := FleetStats{ByPriority: map[string]PriorityStats{}}
	if capacity > 0 {
		fs.IdealWait = time.Duration(float64(clients) / capacity * float64(time.Second))
	}
	answeredCall := map[string]time.Duration{} // prompt → its last answered call's duration
	lastEnd := map[string]time.Time{}
	lastStart := map[string]time.Time{}
	firstCall := map[string]time.Time{} // prompt → its first call's start
	for _, c := range calls {
		if c.Prompt != "" {
			if f, ok := firstCall[c.Prompt]; !ok || c.Start.Before(f) {
				firstCall[c.Prompt] = c.Start
			}
		}
		if c.Status != http.StatusOK || c.End.IsZero() || c.Prompt == "" {
			continue
		}
		if e, ok := lastEnd[c.Prompt]; !ok || c.End.After(e) {
			lastEnd[c.Prompt], lastStart[c.Prompt], answeredCall[c.Prompt] = c.End, c.Start, c.End.Sub(c.Start)
		}
	}

	e2e := map[string][]time.Duration{}
	var overCall, beforeCall, afterCall []time.Duration
	var steps [3][]time.Duration
	for i, o := range outcomes {
		if o.id != "" && rows != nil {
			if _, ok := rows[o.id]; !ok {
				fs.HistoryMissing++
			}
		}
		if !o.sent || o.prio == "" || !o.ended() {
			continue
		}
		d := o.endedAt.Sub(o.sentAt)
		if o.ok {
			d = o.doneAt.Sub(o.sentAt)
		}
		e2e[o.prio] = append(e2e[o.prio], d)
		if o.ok && o.prio == priority.Critical.String() {
			if call, ok := answeredCall[prompts[i]]; ok {
				overCall = append(overCall, d-call)
				beforeCall = append(beforeCall, lastStart[prompts[i]].Sub(o.sentAt))
				afterCall = append(afterCall, o.sentAt.Add(d).Sub(lastEnd[prompts[i]]))
				if r, ok := rows[o.id]; ok && !r.started.IsZero() {
					steps[0] = append(steps[0], r.created.Sub(o.sentAt))
					steps[1] = append(steps[1], r.started.Sub(r.created))
					steps[2] = append(steps[2], lastStart[prompts[i]].Sub(r.started))
				}
			}
		}
	}
	for p, v := range e2e {
		ps := fs.ByPriority[p]
		ps.Ended, ps.E2EP50, ps.E2EP99, ps.E2EMax = len(v), percentile(v, 0.50), percentile(v, 0.99), percentile(v, 1)
		fs.ByPriority[p] = ps
	}
	fs.CriticalCalls, fs.CriticalOverCall = len(overCall), percentile(overCall, 0.99)
	fs.CriticalBeforeCall = [2]time.Duration{percentile(beforeCall, 0.50), percentile(beforeCall, 0.99)}
	fs.CriticalAfterCall = [2]time.Duration{percentile(afterCall, 0.50), percentile(afterCall, 0.99)}
	for k, v := range steps {
		fs.CriticalSteps[k] = [2]time.Duration{percentile(v, 0.50), percentile(v, 0.99)}
	}

	// Queue waits and out-of-order starts, from history, by priority and
	// route.
	promptOfID := map[string]string{}
	for i, o := range outcomes {
		if o.id != "" {
			promptOfID[o.id] = prompts[i]
		}
	}
	type group struct{ prio, route string }
	groups := map[group][]historyRow{}
	for _, r := range rows {
		groups[group{r.priority, r.route}] = append(groups[group{r.priority, r.route}], r)
	}
	for g, rs := range groups {
		byCall := make([]historyRow, len(rs))
		for k, r := range rs {
			r.started = firstCall[promptOfID[r.id]] // zero: no call, counted from its end
			byCall[k] = r
		}
		_, n, worst := overtakes(byCall, now)
		ps := fs.ByPriority[g.prio]
		ps.CallOvertakes += n
		ps.WorstCallOvertake = max(ps.WorstCallOvertake, worst)
		fs.ByPriority[g.prio] = ps
	}
	waits := map[string][]time.Duration{}
	for g, rs := range groups {
		ps := fs.ByPriority[g.prio]
		for _, r := range rs {
			waits[g.prio] = append(waits[g.prio], startOf(r, now).Sub(r.created))
		}
		pairs, n, worst := overtakes(rs, now)
		ps.Pairs += pairs
		ps.Overtakes += n
		ps.WorstOvertake = max(ps.WorstOvertake, worst)
		fs.ByPriority[g.prio] = ps
	}
	for p, v := range waits {
		ps := fs.ByPriority[p]
		ps.Waits, ps.WaitP50, ps.WaitP99, ps.WaitMax = len(v), percentile(v, 0.50), percentile(v, 0.99), percentile(v, 1)
		fs.ByPriority[p] = ps
	}
	if low := fs.ByPriority[priority.Low.String()]; fs.IdealWait > 0 {
		if low.Waits > 0 {
			fs.LowWaitRatio = float64(low.WaitP99) / float64(fs.IdealWait)
		}
		if low.Ended > 0 {
			fs.LowE2ERatio = float64(low.E2EP99) / float64(fs.IdealWait)
		}
	}
	return fs
}

// startOf is when a request started: started_at, or, for one that never
// did, its end (or now when it has none) — a lower bound that still
// counts it as overtaken by everything that started before.
func startOf(r historyRow, now time.Time) time.Time {
	switch {
	case !r.started.IsZero():
		return r.started
	case !r.finished.IsZero():
		return r.finished
	}
	return now
}

// overtakes compares every two requests of rs (one priority and route)
// accepted more than AcceptGap apart: pairs is how many were compared, n how
// many times the one accepted later started more than OvertakeGap before
// the other, worst the largest such gap.
func overtakes(rs []historyRow, now time.Time) (pairs, n int, worst time.Duration) {
	rs = slices.Clone(rs)
	slices.SortFunc(rs, func(a, b historyRow) int { return cmp.Or(a.created.Compare(b.created), strings.Compare(a.id, b.id)) })
	for i := range rs {
		si := startOf(rs[i], now)
		for j := i + 1; j < len(rs); j++ {
			if rs[j].created.Sub(rs[i].created) <= AcceptGap {
				continue
			}
			pairs++
			if gap := si.Sub(startOf(rs[j], now)); gap > OvertakeGap {
				n++
				worst = max(worst, gap)
			}
		}
	}
	return pairs, n, worst
}

// misses returns the fleet targets of t that fs misses, each as a
// sentence.
func (fs FleetStats) misses(t Targets) []string {
	var out []string
	if fs.HistoryErr != "" && (t.MaxLowWaitRatio > 0 || t.NoOvertakes) {
		out = append(out, "history unreadable, no queue waits or start order: "+fs.HistoryErr)
	}
	if fs.HistoryMissing > 0 {
		out = append(out, fmt.Sprintf("%d accepted requests have no history row", fs.HistoryMissing))
	}
	if t.MaxLowWaitRatio > 0 {
		low := fs.ByPriority[priority.Low.String()]
		switch {
		case low.Waits == 0:
			out = append(out, "no LOW queue wait measured")
		case fs.LowWaitRatio > t.MaxLowWaitRatio:
			out = append(out, fmt.Sprintf("LOW queue wait p99 %s = %.2f × the first-come-first-served ideal %s (clients ÷ capacity) > %.2f ×",
				sec(low.WaitP99), fs.LowWaitRatio, sec(fs.IdealWait), t.MaxLowWaitRatio))
		}
	}
	if t.NoOvertakes {
		for _, p := range priority.All {
			if ps := fs.ByPriority[p.String()]; ps.Overtakes > 0 {
				out = append(out, fmt.Sprintf("%s: %d of %d pairs started more than %s out of acceptance order (worst %s)",
					strings.ToUpper(p.String()), ps.Overtakes, ps.Pairs, sec(OvertakeGap), sec(ps.WorstOvertake)))
			}
		}
	}
	if t.MaxCriticalOverCall > 0 {
		switch {
		case fs.CriticalCalls == 0:
			out = append(out, "no answered CRITICAL request with a provider call seen")
		case fs.CriticalOverCall > t.MaxCriticalOverCall:
			out = append(out, fmt.Sprintf("CRITICAL end-to-end p99 is its own call + %s > + %s",
				sec(fs.CriticalOverCall), sec(t.MaxCriticalOverCall)))
		}
	}
	return out
}

// String is the fleet measures for the scenario's line.
func (fs FleetStats) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "ideal_wait=%s low_wait_p99/ideal=%.2f low_e2e_p99/ideal=%.2f crit_e2e_minus_call_p99=%s(n=%d)"+
		" crit_before_call_p50/p99=%s/%s crit_after_call_p50/p99=%s/%s",
		sec(fs.IdealWait), fs.LowWaitRatio, fs.LowE2ERatio, sec(fs.CriticalOverCall), fs.CriticalCalls,
		sec(fs.CriticalBeforeCall[0]), sec(fs.CriticalBeforeCall[1]), sec(fs.CriticalAfterCall[0]), sec(fs.CriticalAfterCall[1]))
	st := fs.CriticalSteps
	fmt.Fprintf(&b, " crit_accept/slot/key_p50=%s/%s/%s crit_accept/slot/key_p99=%s/%s/%s",
		sec(st[0][0]), sec(st[1][0]), sec(st[2][0]), sec(st[0][1]), sec(st[1][1]), sec(st[2][1]))
	for _, p := range priority.All {
		ps, ok := fs.ByPriority[p.String()]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, " %s{ended=%d e2e_p50=%s e2e_p99=%s e2e_max=%s waits=%d wait_p50=%s wait_p99=%s wait_max=%s ooo_1s=%d/%d worst_ooo=%s call_ooo_1s=%d worst_call_ooo=%s}",
			p, ps.Ended, sec(ps.E2EP50), sec(ps.E2EP99), sec(ps.E2EMax), ps.Waits, sec(ps.WaitP50), sec(ps.WaitP99), sec(ps.WaitMax),
			ps.Overtakes, ps.Pairs, sec(ps.WorstOvertake),
			ps.CallOvertakes, sec(ps.WorstCallOvertake))
	}
	if fs.HistoryMissing > 0 {
		fmt.Fprintf(&b, " history_missing=%d", fs.HistoryMissing)
	}
	if fs.HistoryErr != "" {
		fmt.Fprintf(&b, " history_error=%q", fs.HistoryErr)
	}
	return b.String()
}
