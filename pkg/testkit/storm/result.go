package storm

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"bulwark/pkg/testkit/mockprovider"
)

// Result is what one scenario measured.
type Result struct {
	Scenario string
	// Total is the scenario's number of requests; Sent how many were sent
	// before the load ended; Answered how many got the right answer.
	Total, Sent, Answered int
	// Wrong counts answers that were not mockprovider.Reply of the prompt
	// (also counted in Lost as "wrong_answer").
	Wrong int
	// Lost counts the requests not answered, by reason: "cut" for those
	// still open when the time limit ended the load, "not_sent" for those
	// it ended before they were sent, "wrong_answer", "http_503", …
	Lost map[string]int
	// Resubmits counts requests a client sent again after Bulwark answered
	// 429 without taking them (queue full, tenant limit), as a client
	// honouring Retry-After does.
	Resubmits int
	// Wall is the time from the first send to the last correct answer.
	Wall time.Duration
	// SteadyRate is the answers per second between the 25th and the 90th
	// percentile of their arrival times (steadyRate): the scale bench's
	// throughput.
	SteadyRate float64
	// Goodput is Answered ÷ (Wall seconds × the keys' requests per second,
	// or the requests per second their token limits allow when those bind,
	// as in S4-tpm);
	// in S3-mixed the answers of the cloud routes ÷ (Wall seconds × their
	// keys' requests per second, MixedCloudCapacity).
	Goodput float64
	// ProviderCalls and Provider429 are the mock's totals (every call,
	// and the bucket 429s among them); CallsPerRequest is ProviderCalls ÷
	// Sent.
	ProviderCalls, Provider429 int64
	CallsPerRequest            float64
	// Busy is the mock's 503s of a key at its MaxConcurrent calls (a local
	// server's refusal); only S3-mixed sets a MaxConcurrent.
	Busy int64
	// DistinctPrompts among the requests sent.
	DistinctPrompts int
	// Served counts the correct answers by how Bulwark says it answered
	// them (X-Bulwark-Cache, result.cached): none (a provider call), exact,
	// semantic, coalesced. PromptsCalledTwice counts the prompts that
	// more than one request got from a provider call ("none").
	Served             map[string]int
	PromptsCalledTwice int
	// Routes counts the correct answers by the route that served them
	// (X-Bulwark-Provider/X-Bulwark-Model-Tier, result.provider/model_tier;
	// "unknown" when Bulwark named none).
	Routes map[string]int
	// From the mock: KeyCalls are each key's calls and KeyRefused its
	// bucket 429s and busy 503s (keys with none left out), by key id.
	// S3-mixed only: LocalMaxInFlight the most calls at once on the local
	// model's key; StrayCalls the calls on keys the scenario does not
	// know (a Bedrock call signed with other credentials, say).
	KeyCalls, KeyRefused map[string]int64
	LocalMaxInFlight     int64
	StrayCalls           int64
	// MaxInFlight is the most provider calls the mock had in flight at
	// once, over every key: what the global concurrency limit bounds.
	MaxInFlight int64
	// WorkerCalls are the provider calls each worker process made
	// (its bulwark_provider_calls_total), by process name; read only
	// when the scenario chose its processes.
	WorkerCalls map[string]int64
	// P50 and P99 of the end-to-end latency of correct answers (send to
	// answer; async: submit to the completed event).
	P50, P99 time.Duration
	// BreakerOpenings counts openings seen (OpenedBreakers names the
	// breakers); BreakerPollErrors counts failed polls of /admin/breakers.
	BreakerOpenings   int
	OpenedBreakers    []string
	OpeningsByName    map[string]int
	BreakerPollErrors int
	// Async only: CriticalWaits CRITICAL requests reached `started`, with
	// CriticalP99 the p99 of submit → started.
	CriticalWaits int
	CriticalP99   time.Duration
	// ETA is the error of every queue estimate a client received, ETAFirst
	// of the first estimate of each request alone (see the package doc).
	ETA, ETAFirst ErrorStats
	// ETAFirstWarm is ETAFirst of the requests submitted after the first
	// answer: a cold start's first wave is estimated before any call
	// latency is known.
	ETAFirstWarm ErrorStats
	// ETAAbs and ETAFirstAbs are the same estimates' absolute errors
	// |estimate − real|, every one and each request's first.
	ETAAbs, ETAFirstAbs AbsStats
	// ETAStarved counts the estimates of requests that never started
	// (failed or cut while queued): each is counted in ETA against the
	// wait until the request's end, a lower bound of its real wait.
	ETAStarved int
	// ETALate counts the estimates that arrived after the request's last
	// `started` event (a position read as the request left the line):
	// each is counted in ETA against a real remaining wait of 0.
	ETALate int
	// Fleet holds the fleet scenarios' measures (fleet.go); nil for the
	// others.
	Fleet *FleetStats
	// Cut reports that the hard time limit ended the load.
	Cut   bool
	Limit time.Duration
	// MockWindow reports whether the mock ran with -window 1s.
	MockWindow bool
	// Logs holds the last lines of every process's log; Dir the kept
	// temporary folder (Env.KeepDir), else "".
	Logs, Dir string

	async bool // the scenario was async: print the async fields
	mixed bool // the scenario was S3-mixed: print its fields
	procs bool // the scenario chose its api and worker processes: print the mock's gauges
}

// ErrorStats summarises relative errors.
type ErrorStats struct {
	N        int
	P50, P95 float64
}

// AbsStats summarises absolute errors.
type AbsStats struct {
	N        int
	P50, P95 time.Duration
}

func absStats(v []time.Duration) AbsStats {
	if len(v) == 0 {
		return AbsStats{}
	}
	return AbsStats{N: len(v), P50: percentile(v, 0.50), P95: percentile(v, 0.95)}
}

func errorStats(v []float64) ErrorStats {
	if len(v) == 0 {
		return ErrorStats{}
	}
	return ErrorStats{N: len(v), P50: percentile(v, 0.50), P95: percentile(v, 0.95)}
}

// percentile returns the nearest-rank p-quantile of v (sorting a copy).
func percentile[T cmp.Ordered](v []T, p float64) T {
	var zero T
	if len(v) == 0 {
		return zero
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

// etaError is the relative error of an estimate against the real wait,
// the real wait floored at one second (see the package doc): a start
// after 0.05 s would otherwise turn an estimate 0.3 s off into 500 %.
func etaError(estimate, real time.Duration) float64 {
	den := max(real, time.Second)
	return math.Abs(float64(estimate-real)) / float64(den)
}

// String is the result on one line.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-13s answered=%d/%d wall=%s goodput=%.2f calls/req=%.2f provider_429=%d p50=%s p99=%s breaker_openings=%d",
		r.Scenario, r.Answered, r.Total, sec(r.Wall), r.Goodput, r.CallsPerRequest, r.Provider429, sec(r.P50), sec(r.P99), r.BreakerOpenings)
	if len(r.OpenedBreakers) > 0 {
		fmt.Fprintf(&b, "[%s]", strings.Join(r.OpenedBreakers, ","))
	}
	fmt.Fprintf(&b, " calls=%d distinct=%d", r.ProviderCalls, r.DistinctPrompts)
	if r.Served["none"] != r.Answered || r.PromptsCalledTwice > 0 { // some answers came from the cache
		fmt.Fprintf(&b, " served={%s} prompts_called_twice=%d", countsText(r.Served), r.PromptsCalledTwice)
	}
	if r.mixed {
		fmt.Fprintf(&b, " busy=%d local_max_in_flight=%d routes={%s} key_calls={%s}",
			r.Busy, r.LocalMaxInFlight, countsText(r.Routes), countsText(r.KeyCalls))
		if len(r.KeyRefused) > 0 {
			fmt.Fprintf(&b, " key_refused={%s}", countsText(r.KeyRefused))
		}
		if r.StrayCalls > 0 {
			fmt.Fprintf(&b, " stray_calls=%d", r.StrayCalls)
		}
	}
	if r.procs {
		fmt.Fprintf(&b, " max_in_flight=%d worker_calls={%s}", r.MaxInFlight, countsText(r.WorkerCalls))
		if len(r.KeyRefused) > 0 {
			fmt.Fprintf(&b, " key_refused={%s}", countsText(r.KeyRefused))
		}
	}
	if r.async {
		fmt.Fprintf(&b, " crit_p99_wait=%s(n=%d) eta_err_p50=%.2f eta_err_p95=%.2f(n=%d) first_eta_err_p50=%.2f first_eta_err_p95=%.2f(n=%d)"+
			" warm_first_eta_err_p50=%.2f warm_first_eta_err_p95=%.2f(n=%d)",
			sec(r.CriticalP99), r.CriticalWaits, r.ETA.P50, r.ETA.P95, r.ETA.N, r.ETAFirst.P50, r.ETAFirst.P95, r.ETAFirst.N,
			r.ETAFirstWarm.P50, r.ETAFirstWarm.P95, r.ETAFirstWarm.N)
		if r.ETAStarved > 0 || r.ETALate > 0 {
			fmt.Fprintf(&b, " eta_starved=%d eta_after_start=%d", r.ETAStarved, r.ETALate)
		}
	}
	if r.Fleet != nil {
		b.WriteString(" " + r.Fleet.String())
		if r.async {
			fmt.Fprintf(&b, " eta_abs_err_p50=%s eta_abs_err_p95=%s first_eta_abs_err_p50=%s first_eta_abs_err_p95=%s",
				sec(r.ETAAbs.P50), sec(r.ETAAbs.P95), sec(r.ETAFirstAbs.P50), sec(r.ETAFirstAbs.P95))
		}
	}
	if lost := r.lostText(); lost != "" {
		fmt.Fprintf(&b, " lost={%s}", lost)
	}
	if r.Resubmits > 0 {
		fmt.Fprintf(&b, " resubmits=%d", r.Resubmits)
	}
	if r.Cut {
		fmt.Fprintf(&b, " CUT_AT_LIMIT=%s", r.Limit)
	}
	if r.BreakerPollErrors > 0 {
		fmt.Fprintf(&b, " breaker_poll_errors=%d", r.BreakerPollErrors)
	}
	return b.String()
}

func (r Result) lostText() string { return countsText(r.Lost) }

// countsText prints counts as k:n,… sorted by key.
func countsText[N int | int64](m map[string]N) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, ",")
}

func sec(d time.Duration) string { return fmt.Sprintf("%.2fs", d.Seconds()) }

// Misses returns every target of t the result misses, each as a sentence;
// none means it met them all.
func (r Result) Misses(t Targets) []string {
	var out []string
	if t.AllAnswered && r.Answered != r.Total {
		out = append(out, fmt.Sprintf("answered %d of %d", r.Answered, r.Total))
	}
	if t.MinGoodput > 0 && r.Goodput < t.MinGoodput {
		out = append(out, fmt.Sprintf("goodput %.2f < %.2f", r.Goodput, t.MinGoodput))
	}
	if t.MaxCallsPerRequest > 0 && r.CallsPerRequest > t.MaxCallsPerRequest {
		out = append(out, fmt.Sprintf("%.2f provider calls per request > %.2f", r.CallsPerRequest, t.MaxCallsPerRequest))
	}
	if t.NoBreakerOpenings && r.BreakerOpenings-r.OpeningsByName[t.MustOpen] > 0 {
		out = append(out, fmt.Sprintf("%d breaker openings (%s)", r.BreakerOpenings-r.OpeningsByName[t.MustOpen], strings.Join(r.OpenedBreakers, ", ")))
	}
	if t.MustOpen != "" && r.OpeningsByName[t.MustOpen] == 0 {
		out = append(out, "breaker "+t.MustOpen+" never opened")
	}
	if t.CallsEqualDistinct && r.ProviderCalls != int64(r.DistinctPrompts) {
		out = append(out, fmt.Sprintf("%d provider calls for %d distinct prompts", r.ProviderCalls, r.DistinctPrompts))
	}
	if t.MaxCriticalP99 > 0 {
		switch {
		case r.CriticalWaits == 0:
			out = append(out, "no CRITICAL request reached started")
		case r.CriticalP99 > t.MaxCriticalP99:
			out = append(out, fmt.Sprintf("CRITICAL p99 wait %s > %s", sec(r.CriticalP99), sec(t.MaxCriticalP99)))
		}
	}
	if t.NoOverSubscription {
		if r.Provider429 > 0 || r.Busy > 0 {
			out = append(out, fmt.Sprintf("over-subscribed: %d bucket 429s and %d busy 503s from the providers (by key: %s)",
				r.Provider429, r.Busy, countsText(r.KeyRefused)))
		}
		if r.StrayCalls > 0 {
			out = append(out, fmt.Sprintf("%d provider calls on keys the scenario does not know", r.StrayCalls))
		}
	}
	if t.MaxLocalInFlight > 0 && r.LocalMaxInFlight > t.MaxLocalInFlight {
		out = append(out, fmt.Sprintf("%d calls at once on the local model's key > its %d", r.LocalMaxInFlight, t.MaxLocalInFlight))
	}
	for _, route := range t.MustServe {
		if r.Routes[route] == 0 {
			out = append(out, "route "+route+" served no request")
		}
	}
	if t.MaxETAErrP50 > 0 {
		for _, e := range []struct {
			what string
			s    ErrorStats
		}{{"queue estimates", r.ETA}, {"first estimates", r.ETAFirst}} {
			if e.s.N == 0 || e.s.P50 > t.MaxETAErrP50 || e.s.P95 > t.MaxETAErrP95 {
				out = append(out, fmt.Sprintf("%s off by %.2f at the median, %.2f at p95 (n=%d; want <= %.2f, %.2f)",
					e.what, e.s.P50, e.s.P95, e.s.N, t.MaxETAErrP50, t.MaxETAErrP95))
			}
		}
	}
	if t.MaxLowWaitRatio > 0 || t.NoOvertakes || t.MaxCriticalOverCall > 0 {
		if r.Fleet == nil {
			out = append(out, "no fleet measures (queue waits, start order, CRITICAL over its call)")
		} else {
			out = append(out, r.Fleet.misses(t)...)
		}
	}
	return out
}

// poolStats fills KeyCalls and KeyRefused of a scenario on the storm's
// OpenAI keys from the mock's stats, by key id.
func (r *Result) poolStats(sc Scenario, st mockprovider.Stats) {
	r.KeyCalls, r.KeyRefused = map[string]int64{}, map[string]int64{}
	for i := range sc.keys() {
		id := stormKeyID(i)
		c := st.Keys[mockprovider.Fingerprint(stormKey(i))]
		r.KeyCalls[id] = c.Requests
		if n := c.RateLimited + c.Busy; n > 0 {
			r.KeyRefused[id] = n
		}
	}
}
