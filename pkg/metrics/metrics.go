// Package metrics defines every Prometheus metric Bulwark exports, on a
// registry the caller supplies.
//
// # Construction
//
// New registers the process's own counters and histograms and returns them
// as exported fields of a Metrics; NewStateCollector reads the shared Redis
// state (queue depths, slots, keys, breakers) at scrape time. Nothing here
// touches the default registry, so a test can build as many as it likes.
//
// # Labels
//
// Every name starts with "bulwark_". Every label takes its values from a
// bounded set: a priority name, a provider, a model tier, a route string
// ("claude/sonnet"), a breaker name, a key's configured id (never the key
// itself), or one of the closed vocabularies below (Outcome*, Status*,
// CacheResult*, Reason*, Direction*). A secret, a request id, a tenant token
// or free text never becomes a label value: each would leak, or grow the
// series count without bound.
//
// # Alerts and dashboard
//
// deploy/prometheus/alerts.yml and deploy/grafana/bulwark.json use these
// names; the package's tests check that every name they use exists here and
// run promtool on the rules.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"bulwark/pkg/job"
	"bulwark/pkg/llm"
)

// Metric family names. They are constants so that the tests, the alert
// rules and the dashboard can be checked against one list (FamilyNames).
const (
	NameProviderCalls     = "bulwark_provider_calls_total"
	NameProviderLatency   = "bulwark_provider_latency_seconds"
	NameRequestDuration   = "bulwark_request_duration_seconds"
	NameKeyWait           = "bulwark_key_wait_seconds"
	NameRequests          = "bulwark_requests_total"
	NameRequestsSubmitted = "bulwark_requests_submitted_total"
	NameCacheLookups      = "bulwark_cache_lookups_total"
	NameCoalesced         = "bulwark_coalesced_requests_total"
	NameFallbacks         = "bulwark_fallbacks_total"
	NameAdmissionRejected = "bulwark_admission_rejected_total"
	NameTokens            = "bulwark_tokens_total"
	NameCostUSD           = "bulwark_cost_usd_total"
	NameKeyCooldowns      = "bulwark_key_cooldowns_total"
	NameKeysDisabled      = "bulwark_keys_disabled_total"
	NameCacheUnavailable  = "bulwark_cache_unavailable_total"
	NameCacheStoresShed   = "bulwark_cache_stores_shed_total"
	NameCacheMemoHits     = "bulwark_cache_memo_hits_total"
	NameTokensSaved       = "bulwark_compression_tokens_saved_total"
	NameHistoryErrors     = "bulwark_history_write_errors_total"
	NameHistoryDropped    = "bulwark_history_dropped_total"
	NameRequestsLost      = "bulwark_requests_lost_total"
	NameHistoryBacklog    = "bulwark_history_backlog"

	NameQueueDepth        = "bulwark_queue_depth"
	NameQueueOldestWait   = "bulwark_queue_oldest_wait_seconds"
	NameSlotsInUse        = "bulwark_slots_in_use"
	NameKeysAvailable     = "bulwark_keys_available"
	NameKeysTotal         = "bulwark_keys_total"
	NameBreakerState      = "bulwark_breaker_state"
	NameStateScrapeErrors = "bulwark_state_scrape_errors_total"
)

// Values of the status label of bulwark_requests_total: how a request ended.
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
	StatusCancelled = "cancelled"
)

// Values of the result label of bulwark_cache_lookups_total.
const (
	// CacheResultExact: the exact (scope, prompt hash) row answered.
	CacheResultExact = string(job.CachedExact)
	// CacheResultSemantic: a row above the similarity threshold answered.
	CacheResultSemantic = string(job.CachedSemantic)
	// CacheResultMiss: the cache was asked and had nothing.
	CacheResultMiss = "miss"
	// CacheResultBypass: the cache was not asked (the caller opted out, or
	// the layer is not cached).
	CacheResultBypass = "bypass"
	// CacheResultError: the lookup failed (PostgreSQL down or slow); the
	// request went on uncached.
	CacheResultError = "error"
)

// Values of the reason label of bulwark_admission_rejected_total.
const (
	ReasonQueueFull   = "queue_full"
	ReasonRateLimited = "rate_limited"
	ReasonTenantFull  = "tenant_full"
	ReasonOverBudget  = "over_budget" // the tenant's Redis budget is spent
)

// Values of the direction label of bulwark_tokens_total.
const (
	DirectionInput  = "input"
	DirectionOutput = "output"
)

// Values of the cached label of bulwark_request_duration_seconds.
const (
	CachedTrue  = "true"
	CachedFalse = "false"
)

// Histogram buckets, in seconds.
var (
	// providerLatencyBuckets spans one provider call: tens of milliseconds
	// for a cached prefix up to a minute for a long generation.
	providerLatencyBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 45, 60}
	// requestDurationBuckets spans submit → final answer: a cache hit in
	// milliseconds up to the queue's 300 s maximum wait. 15 is a bucket
	// boundary so that the P95 > 15 s alert is read exactly, not
	// interpolated.
	requestDurationBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120, 180, 300}
	// keyWaitBuckets spans a turn in a route's key line: a route interval
	// (tens of milliseconds) up to worker.pace_wait (2 s) and a little past.
	keyWaitBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4}
)

// Metrics holds the collectors one process updates. All fields are safe for
// concurrent use.
type Metrics struct {
	// ProviderCalls counts provider calls by provider, tier, key_id (the
	// key's configured id, never the key) and outcome (Outcome). The 429
	// ratio is outcome="rate_limited" over all.
	ProviderCalls *prometheus.CounterVec
	// ProviderLatency observes one provider call's duration in seconds, by
	// provider and tier, whatever its outcome.
	ProviderLatency *prometheus.HistogramVec
	// RequestDuration observes a request's end-to-end time in seconds, from
	// submit to its final state, by priority and cached ("true" when the
	// answer came from the cache or a coalesced twin, else "false").
	RequestDuration *prometheus.HistogramVec
	// KeyWait observes how long a request that held its slot waited for
	// its turn at a key (the route's key line, and the reserved moment),
	// in seconds, by priority, provider and tier: the wait a report of the
	// slots alone cannot see (a CRITICAL request behind LOW ones at the
	// keys would show here).
	KeyWait *prometheus.HistogramVec
	// Requests counts finished requests by priority and status
	// (StatusCompleted, StatusFailed, StatusCancelled).
	Requests *prometheus.CounterVec
	// RequestsSubmitted counts accepted submissions by priority.
	RequestsSubmitted *prometheus.CounterVec
	// CacheLookups counts cache lookups by layer (router, agent,
	// synthesizer) and result (CacheResult*).
	CacheLookups *prometheus.CounterVec
	// Coalesced counts requests attached to an identical in-flight request
	// instead of making their own task.
	Coalesced prometheus.Counter
	// Fallbacks counts switches from one route to another, by route strings
	// from and to (e.g. "claude/sonnet" → "openai/gpt4o").
	Fallbacks *prometheus.CounterVec
	// AdmissionRejected counts submissions refused by priority and reason
	// (ReasonQueueFull, ReasonRateLimited, ReasonTenantFull).
	AdmissionRejected *prometheus.CounterVec
	// Tokens counts tokens used by provider, tier and direction
	// (DirectionInput, DirectionOutput).
	Tokens *prometheus.CounterVec
	// CostUSD accumulates the estimated spend in US dollars by provider and
	// tier (see Cost).
	CostUSD *prometheus.CounterVec
	// KeyCooldowns counts cooldowns started on a key, by key_id.
	KeyCooldowns *prometheus.CounterVec
	// KeysDisabled counts keys disabled (quota exhausted, bad credential),
	// by key_id.
	KeysDisabled *prometheus.CounterVec
	// CacheUnavailable counts requests for which the cache was bypassed
	// because PostgreSQL could not be reached.
	CacheUnavailable prometheus.Counter
	// TokensSaved counts the input tokens prompt compression took off
	// answered requests, by the route that served them.
	TokensSaved *prometheus.CounterVec
	// HistoryErrors counts request-history writes PostgreSQL refused or
	// timed out (the requests themselves go on).
	HistoryErrors prometheus.Counter
	// HistoryDropped counts outcomes whose history write failed and that
	// the full outbox could not keep: their rows stay as they were.
	HistoryDropped prometheus.Counter
	// RequestsLost counts accepted requests whose live record Redis lost
	// with no ending recorded (a failover, a restart without persistence),
	// as the reconcile job finds them and ends their history rows.
	RequestsLost prometheus.Counter
}

// New creates Bulwark's collectors and registers them on reg. It panics if
// one is already registered there, as prometheus.MustRegister does: that is
// a wiring bug found at start-up. A nil reg registers nothing; the returned
// collectors still work, which suits tests of other packages.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ProviderCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameProviderCalls,
			Help: "Provider calls by provider, tier, key id and outcome.",
		}, []string{"provider", "tier", "key_id", "outcome"}),
		ProviderLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameProviderLatency,
			Help:    "Duration of one provider call in seconds.",
			Buckets: providerLatencyBuckets,
		}, []string{"provider", "tier"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameRequestDuration,
			Help:    "End-to-end request time in seconds, from submit to the final state.",
			Buckets: requestDurationBuckets,
		}, []string{"priority", "cached"}),
		KeyWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameKeyWait,
			Help:    "Time a request holding its slot waited for its turn at a key of its route, in seconds.",
			Buckets: keyWaitBuckets,
		}, []string{"priority", "provider", "tier"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRequests,
			Help: "Finished requests by priority and final status.",
		}, []string{"priority", "status"}),
		RequestsSubmitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameRequestsSubmitted,
			Help: "Accepted request submissions by priority.",
		}, []string{"priority"}),
		CacheLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameCacheLookups,
			Help: "Cache lookups by cache layer and result (exact, semantic, miss, bypass, error).",
		}, []string{"layer", "result"}),
		Coalesced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameCoalesced,
			Help: "Requests attached to an identical in-flight request instead of a new task.",
		}),
		Fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameFallbacks,
			Help: "Fallbacks from one route (provider/tier) to another.",
		}, []string{"from", "to"}),
		AdmissionRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionRejected,
			Help: "Submissions refused at admission by priority and reason.",
		}, []string{"priority", "reason"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameTokens,
			Help: "Tokens used by provider, tier and direction (input, output).",
		}, []string{"provider", "tier", "direction"}),
		CostUSD: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameCostUSD,
			Help: "Estimated provider spend in US dollars by provider and tier.",
		}, []string{"provider", "tier"}),
		KeyCooldowns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameKeyCooldowns,
			Help: "Cooldowns started on a provider key, by key id.",
		}, []string{"key_id"}),
		KeysDisabled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameKeysDisabled,
			Help: "Provider keys disabled (quota exhausted or bad credential), by key id.",
		}, []string{"key_id"}),
		HistoryErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameHistoryErrors,
			Help: "Request-history writes that failed (PostgreSQL down or slow); the requests go on.",
		}),
		HistoryDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameHistoryDropped,
			Help: "Request outcomes lost to history: the write failed and the outbox was full (the request ids are logged).",
		}),
		CacheUnavailable: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameCacheUnavailable,
			Help: "Requests for which the cache was bypassed because PostgreSQL was unavailable.",
		}),
		RequestsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameRequestsLost,
			Help: "Accepted requests Redis lost with no ending recorded (a failover, a restart without persistence), found by the history reconcile job; their history rows end failed (lost).",
		}),
		TokensSaved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: NameTokensSaved,
			Help: "Estimated input tokens prompt compression took off answered requests, by the route that served them.",
		}, []string{"provider", "tier"}),
	}
	if reg != nil {
		reg.MustRegister(
			m.ProviderCalls, m.ProviderLatency, m.RequestDuration, m.KeyWait, m.Requests,
			m.RequestsSubmitted, m.CacheLookups, m.Coalesced, m.Fallbacks,
			m.AdmissionRejected, m.Tokens, m.CostUSD, m.KeyCooldowns,
			m.KeysDisabled, m.CacheUnavailable, m.HistoryErrors, m.HistoryDropped, m.RequestsLost, m.TokensSaved,
		)
	}
	return m
}

// ObserveCall records one provider call on route with the key whose
// configured id is keyID: its outcome (Outcome(err)) and its latency.
func (m *Metrics) ObserveCall(route llm.Route, keyID string, err error, latency time.Duration) {
	p := string(route.Provider)
	m.ProviderCalls.WithLabelValues(p, route.Tier, keyID, Outcome(err)).Inc()
	m.ProviderLatency.WithLabelValues(p, route.Tier).Observe(latency.Seconds())
}

// AddUsage records the tokens of one successful call on route and its cost
// at price p.
func (m *Metrics) AddUsage(route llm.Route, u llm.Usage, p Price) {
	prov := string(route.Provider)
	if u.InputTokens > 0 {
		m.Tokens.WithLabelValues(prov, route.Tier, DirectionInput).Add(float64(u.InputTokens))
	}
	if u.OutputTokens > 0 {
		m.Tokens.WithLabelValues(prov, route.Tier, DirectionOutput).Add(float64(u.OutputTokens))
	}
	if c := Cost(p, u); c > 0 {
		m.CostUSD.WithLabelValues(prov, route.Tier).Add(c)
	}
}

// InitKeys creates the per-key series of KeyCooldowns and KeysDisabled at
// zero for each configured key id. Call it at start-up with every key id:
// Prometheus's increase() does not count a series' first appearance, so
// without it a key's first disable would not fire BulwarkKeyDisabled.
func (m *Metrics) InitKeys(keyIDs ...string) {
	for _, id := range keyIDs {
		m.KeyCooldowns.WithLabelValues(id)
		m.KeysDisabled.WithLabelValues(id)
	}
}

// FamilyNames lists every metric family name this package defines, those
// of New and those of NewStateCollector, in no particular order.
func FamilyNames() []string {
	return []string{
		NameProviderCalls, NameProviderLatency, NameRequestDuration, NameKeyWait, NameRequests,
		NameRequestsSubmitted, NameCacheLookups, NameCoalesced, NameFallbacks,
		NameAdmissionRejected, NameTokens, NameCostUSD, NameKeyCooldowns,
		NameKeysDisabled, NameCacheUnavailable, NameHistoryErrors, NameHistoryDropped, NameRequestsLost, NameTokensSaved,
		NameQueueDepth, NameQueueOldestWait, NameSlotsInUse, NameKeysAvailable,
		NameKeysTotal, NameBreakerState, NameHistoryBacklog, NameStateScrapeErrors,
		NameRedisPoolConnections, NameRedisPoolWaits, NameRedisPoolWaitSeconds, NameRedisPoolTimeouts,
	}
}
