package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StateReadTimeoutDefault bounds one read of the shared state during a
// scrape when NewStateCollector is given no timeout. It is well below
// Prometheus's default 10 s scrape timeout, so a slow Redis costs one empty
// scrape, not a failed one.
const StateReadTimeoutDefault = 2 * time.Second

// Values of bulwark_breaker_state.
const (
	BreakerClosed   = 0
	BreakerHalfOpen = 1
	BreakerOpen     = 2
)

// BreakerStateValue maps a breaker state name ("closed", "half_open",
// "open", as pkg/breaker spells them) to its bulwark_breaker_state value,
// and reports false for any other name.
func BreakerStateValue(state string) (int, bool) {
	switch state {
	case "closed":
		return BreakerClosed, true
	case "half_open":
		return BreakerHalfOpen, true
	case "open":
		return BreakerOpen, true
	}
	return 0, false
}

// State is the shared state (Redis) that all processes see alike, read
// once per scrape. Map keys become label values, so they must come from
// bounded sets: priority names, route strings, breaker names.
type State struct {
	// QueueDepth is the number of waiting requests by priority name.
	QueueDepth map[string]int
	// OldestWaitSeconds is how long the oldest waiting request of each
	// priority has waited, in seconds.
	OldestWaitSeconds map[string]float64
	// SlotsInUse is the number of global concurrency slots held, by
	// priority name.
	SlotsInUse map[string]int
	// KeysAvailable is the number of enabled, not cooling keys by route
	// string ("claude/sonnet").
	KeysAvailable map[string]int
	// KeysTotal is the number of configured keys by route string.
	KeysTotal map[string]int
	// BreakerState is each breaker's state by breaker name: BreakerClosed,
	// BreakerHalfOpen or BreakerOpen.
	BreakerState map[string]int
	// HistoryBacklog is how many request outcomes wait for PostgreSQL to
	// be written to history (pkg/history's outbox).
	HistoryBacklog int
}

// stateCollector is the prometheus.Collector of NewStateCollector.
type stateCollector struct {
	read    func(ctx context.Context) (State, error)
	timeout time.Duration

	queueDepth *prometheus.Desc
	oldestWait *prometheus.Desc
	slotsInUse *prometheus.Desc
	keysAvail  *prometheus.Desc
	keysTotal  *prometheus.Desc
	breaker    *prometheus.Desc
	backlog    *prometheus.Desc
	errors     prometheus.Counter
}

// NewStateCollector returns a collector that calls read once per scrape,
// with a context bounded by timeout (zero or negative means
// StateReadTimeoutDefault), and exposes the gauges bulwark_queue_depth,
// bulwark_queue_oldest_wait_seconds, bulwark_slots_in_use,
// bulwark_keys_available, bulwark_keys_total, bulwark_breaker_state and
// bulwark_history_backlog, plus the counter bulwark_state_scrape_errors_total.
//
// Reading at scrape time, rather than setting gauges as things change,
// means every process reports the same shared truth and a dead process
// leaves no stale value behind. When read fails the scrape exposes none of
// the gauges (a stale or zero value would silence the alerts on them) and
// counts the error. read must honour its context's deadline. The collector
// is safe for concurrent scrapes.
func NewStateCollector(read func(ctx context.Context) (State, error), timeout time.Duration) prometheus.Collector {
	if timeout <= 0 {
		timeout = StateReadTimeoutDefault
	}
	return &stateCollector{
		read:    read,
		timeout: timeout,
		queueDepth: prometheus.NewDesc(NameQueueDepth,
			"Requests waiting in the queue, by priority.", []string{"priority"}, nil),
		oldestWait: prometheus.NewDesc(NameQueueOldestWait,
			"How long the oldest waiting request has waited, in seconds, by priority.", []string{"priority"}, nil),
		slotsInUse: prometheus.NewDesc(NameSlotsInUse,
			"Global provider concurrency slots held, by priority.", []string{"priority"}, nil),
		keysAvail: prometheus.NewDesc(NameKeysAvailable,
			"Provider keys enabled and not cooling, by route (provider/tier).", []string{"route"}, nil),
		keysTotal: prometheus.NewDesc(NameKeysTotal,
			"Provider keys configured, by route (provider/tier).", []string{"route"}, nil),
		breaker: prometheus.NewDesc(NameBreakerState,
			"Circuit breaker state: 0 closed, 1 half-open, 2 open.", []string{"breaker"}, nil),
		backlog: prometheus.NewDesc(NameHistoryBacklog,
			"Request outcomes waiting for PostgreSQL to be written to history.", nil, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: NameStateScrapeErrors,
			Help: "Scrapes in which the shared state could not be read; the state gauges were omitted.",
		}),
	}
}

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.queueDepth
	ch <- c.oldestWait
	ch <- c.slotsInUse
	ch <- c.keysAvail
	ch <- c.keysTotal
	ch <- c.breaker
	ch <- c.backlog
	c.errors.Describe(ch)
}

// Collect implements prometheus.Collector. The Collector interface passes
// no context, so the read's context starts here.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	st, err := c.read(ctx)
	if err != nil {
		c.errors.Inc()
		c.errors.Collect(ch)
		return
	}
	c.errors.Collect(ch)
	gauges(ch, c.queueDepth, st.QueueDepth)
	gauges(ch, c.oldestWait, st.OldestWaitSeconds)
	gauges(ch, c.slotsInUse, st.SlotsInUse)
	gauges(ch, c.keysAvail, st.KeysAvailable)
	gauges(ch, c.keysTotal, st.KeysTotal)
	gauges(ch, c.breaker, st.BreakerState)
	ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(st.HistoryBacklog))
}

// gauges sends one gauge of desc per entry of values, the key being the
// desc's only label. A key that is not valid UTF-8 becomes an invalid metric
// (the registry reports it) rather than a panic inside a scrape.
func gauges[V int | float64](ch chan<- prometheus.Metric, desc *prometheus.Desc, values map[string]V) {
	for label, v := range values {
		m, err := prometheus.NewConstMetric(desc, prometheus.GaugeValue, float64(v), label)
		if err != nil {
			m = prometheus.NewInvalidMetric(desc, err)
		}
		ch <- m
	}
}
