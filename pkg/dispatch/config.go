package dispatch

import (
	"fmt"
	"time"

	"bulwark/pkg/llm"
	"bulwark/pkg/metrics"
	"bulwark/pkg/priority"
)

// Defaults of Config; pkg/config uses these, so each is written once.
const (
	MaxKeyTriesDefault      = 4
	MinWaitDefault          = 100 * time.Millisecond
	MaxTransientWaitDefault = 30 * time.Second
	PaceWaitDefault         = 2 * time.Second
	HoldWaitDefault         = 10 * time.Second
	SlotRenewDefault        = 10 * time.Second
	SlotBusyDelayDefault    = 500 * time.Millisecond
)

// Config configures the dispatcher.
type Config struct {
	Clients map[llm.Provider]llm.Client
	// RouteOrder returns the routes a request tries, in order: a routing
	// rule's first, the asked route, its fallback chain (config.RouteOrder).
	// nil: the asked route only.
	RouteOrder func(asked llm.Route, layer string) []llm.Route
	// ModelName returns a route's provider model name.
	ModelName func(llm.Route) string
	// OutputLimit returns the most max_tokens a route's model accepts
	// (config: max_output_tokens): a request sent to a route whose limit
	// is below its max_tokens (a fallback, a routing rule's route) is
	// clamped to it, and its record says so (job.State.MaxTokensClamped).
	// nil, or 0 for a route: no limit.
	OutputLimit func(llm.Route) int
	// Price of a route, for cost metrics.
	Price func(llm.Route) metrics.Price
	// Compress, when set, shortens a request's prompt before it is sent
	// (pkg/compress), returning the copy and the tokens saved; requests
	// that opted out (job.Job.NoCompress) are sent as written.
	Compress func(*llm.Request) (llm.Request, int)
	// MaxKeyTries bounds calls on one route within one attempt. Default MaxKeyTriesDefault (4).
	MaxKeyTries int
	// MinWait is the shortest re-enqueue delay. Default MinWaitDefault (100ms).
	MinWait time.Duration
	// MaxTransientWait caps the delay of an asynq retry after transient
	// failures. Default MaxTransientWaitDefault (30s).
	MaxTransientWait time.Duration
	// MaxActive caps, per priority, the tasks this process works on at
	// once (waiting for a slot or for capacity, or calling); a task beyond
	// it goes back to its queue for SlotBusyDelay instead of holding a
	// worker goroutine. Without it a flood of LOW tasks would occupy every
	// goroutine, and a CRITICAL task could not even be dequeued until one
	// finished. 0 for a priority means no cap.
	MaxActive map[priority.Priority]int
	// PaceWait is the longest a request holds its global slot waiting for
	// its turn in a route's key line (keypool.InLine). Default PaceWaitDefault (2s).
	PaceWait time.Duration
	// HoldWait is the longest a request waits for capacity inside the
	// worker (without a slot) before going back to asynq with a delay.
	// Default HoldWaitDefault (10s); at least PaceWait.
	HoldWait time.Duration
	// SlotRenew is how often a held slot's lease is renewed while its call
	// runs; it must be well under the slot lease. Default SlotRenewDefault (10s).
	SlotRenew time.Duration
	// SlotBusyDelay before a task turned away by MaxSlotWaiters is taken
	// again (jittered ±50%). Default SlotBusyDelayDefault (500ms).
	SlotBusyDelay time.Duration
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	orDefault(&c.MaxKeyTries, MaxKeyTriesDefault)
	orDefault(&c.MinWait, MinWaitDefault)
	orDefault(&c.MaxTransientWait, MaxTransientWaitDefault)
	orDefault(&c.SlotBusyDelay, SlotBusyDelayDefault)
	orDefault(&c.PaceWait, PaceWaitDefault)
	orDefault(&c.HoldWait, HoldWaitDefault)
	orDefault(&c.SlotRenew, SlotRenewDefault)
	if c.Price == nil {
		c.Price = func(llm.Route) metrics.Price { return metrics.Price{} }
	}
	return c
}

func orDefault[T int | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Validate reports the first field of c (defaults applied) out of range,
// named as in config.yaml's worker section where it has a name there.
func (c Config) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"pace_wait", c.PaceWait}, {"hold_wait", c.HoldWait}, {"min wait", c.MinWait},
		{"max transient wait", c.MaxTransientWait}, {"slot renewal", c.SlotRenew}, {"slot busy delay", c.SlotBusyDelay},
	} {
		if d.v <= 0 {
			return fmt.Errorf("dispatch: %s must be > 0, got %s", d.name, d.v)
		}
	}
	if c.MaxKeyTries <= 0 {
		return fmt.Errorf("dispatch: key tries must be > 0, got %d", c.MaxKeyTries)
	}
	if c.HoldWait < c.PaceWait {
		return fmt.Errorf("dispatch: hold_wait (%s) must be >= pace_wait (%s)", c.HoldWait, c.PaceWait)
	}
	for p, n := range c.MaxActive {
		if n < 0 {
			return fmt.Errorf("dispatch: max active of %s must be >= 0, got %d", p, n)
		}
	}
	return nil
}
