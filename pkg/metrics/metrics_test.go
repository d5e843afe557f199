package metrics

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"bulwark/pkg/llm"
)

var (
	claudeSonnet = llm.Route{Provider: llm.ProviderClaude, Tier: "sonnet"}
	openaiGPT4o  = llm.Route{Provider: llm.ProviderOpenAI, Tier: "gpt4o"}
)

// fullState has an entry in every map, so that every state gauge appears.
func fullState() State {
	return State{
		QueueDepth:        map[string]int{"critical": 1, "low": 7},
		OldestWaitSeconds: map[string]float64{"critical": 0.5, "low": 42},
		SlotsInUse:        map[string]int{"critical": 2, "high": 9},
		KeysAvailable:     map[string]int{"claude/sonnet": 1, "openai/gpt4o": 3},
		KeysTotal:         map[string]int{"claude/sonnet": 2, "openai/gpt4o": 3},
		BreakerState:      map[string]int{"claude/sonnet": BreakerOpen, "openai/gpt4o": BreakerClosed},
	}
}

// fullRegistry returns a fresh registry holding New's collectors and a
// state collector, with every metric touched once, so that every family
// the package defines is gathered.
func fullRegistry(t *testing.T) (*prometheus.Registry, *Metrics) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := New(reg)
	reg.MustRegister(NewStateCollector(func(context.Context) (State, error) { return fullState(), nil }, time.Second),
		NewRedisPoolCollector(fakePool{TotalConns: 5, IdleConns: 3, Timeouts: 2}))

	m.InitKeys("claude-1")
	m.ObserveCall(claudeSonnet, "claude-1", nil, 800*time.Millisecond)
	m.ObserveCall(claudeSonnet, "claude-1", &llm.Error{Class: llm.ClassRateLimited, Status: 429}, 50*time.Millisecond)
	m.RequestDuration.WithLabelValues("high", CachedFalse).Observe(3.2)
	m.KeyWait.WithLabelValues("critical", "claude", "sonnet").Observe(0.08)
	m.Requests.WithLabelValues("high", StatusCompleted).Inc()
	m.RequestsSubmitted.WithLabelValues("high").Inc()
	m.CacheLookups.WithLabelValues("agent", CacheResultSemantic).Inc()
	m.Coalesced.Inc()
	m.Fallbacks.WithLabelValues(claudeSonnet.String(), openaiGPT4o.String()).Inc()
	m.AdmissionRejected.WithLabelValues("low", ReasonQueueFull).Inc()
	m.AddUsage(claudeSonnet, llm.Usage{InputTokens: 1000, OutputTokens: 200}, Price{InputPerMTok: 3, OutputPerMTok: 15})
	m.KeyCooldowns.WithLabelValues("claude-1").Inc()
	m.KeysDisabled.WithLabelValues("claude-1").Inc()
	m.CacheUnavailable.Inc()
	m.TokensSaved.WithLabelValues("claude", "sonnet").Add(120)
	return reg, m
}

func gather(t *testing.T, g prometheus.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// value returns the value of the series of family name whose labels are
// exactly labels, failing the test when there is none.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	mf, ok := fams[name]
	if !ok {
		t.Fatalf("family %s not gathered", name)
	}
	for _, mt := range mf.GetMetric() {
		got := map[string]string{}
		for _, lp := range mt.GetLabel() {
			got[lp.GetName()] = lp.GetValue()
		}
		if !cmp.Equal(got, labels) {
			continue
		}
		switch {
		case mt.Counter != nil:
			return mt.GetCounter().GetValue()
		case mt.Gauge != nil:
			return mt.GetGauge().GetValue()
		case mt.Histogram != nil:
			return float64(mt.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("%s%v not gathered", name, labels)
	return 0
}

func TestNewRegistersEveryFamily(t *testing.T) {
	t.Parallel()
	reg, _ := fullRegistry(t)
	fams := gather(t, reg)

	var got []string
	for name, mf := range fams {
		got = append(got, name)
		if len(mf.GetMetric()) == 0 {
			t.Errorf("%s gathered with no series", name)
		}
	}
	want := slices.Clone(FamilyNames())
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("gathered families differ from FamilyNames() (-want +got):\n%s", diff)
	}

	wantTypes := map[string]dto.MetricType{
		NameProviderLatency:      dto.MetricType_HISTOGRAM,
		NameRequestDuration:      dto.MetricType_HISTOGRAM,
		NameKeyWait:              dto.MetricType_HISTOGRAM,
		NameQueueDepth:           dto.MetricType_GAUGE,
		NameQueueOldestWait:      dto.MetricType_GAUGE,
		NameSlotsInUse:           dto.MetricType_GAUGE,
		NameKeysAvailable:        dto.MetricType_GAUGE,
		NameKeysTotal:            dto.MetricType_GAUGE,
		NameBreakerState:         dto.MetricType_GAUGE,
		NameHistoryBacklog:       dto.MetricType_GAUGE,
		NameRedisPoolConnections: dto.MetricType_GAUGE,
	}
	for name, mf := range fams {
		want, ok := wantTypes[name]
		if !ok {
			want = dto.MetricType_COUNTER
		}
		if mf.GetType() != want {
			t.Errorf("%s is a %v, want %v", name, mf.GetType(), want)
		}
	}
}

// TestLabelsAreBounded pins the label names: each takes values from a
// bounded set. A new label must be added here deliberately, which is the
// moment to ask whether it could carry a secret, a request id, a tenant
// token or free text.
func TestLabelsAreBounded(t *testing.T) {
	t.Parallel()
	bounded := map[string]bool{
		"provider": true, "tier": true, "key_id": true, "outcome": true,
		"priority": true, "cached": true, "status": true, "layer": true,
		"result": true, "from": true, "to": true, "reason": true,
		"direction": true, "route": true, "breaker": true,
		"state": true, // a pool connection's: idle, in_use
		"le":    true, // histogram buckets
	}
	reg, _ := fullRegistry(t)
	for name, mf := range gather(t, reg) {
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if !bounded[lp.GetName()] {
					t.Errorf("%s has label %q, which is not in the bounded set", name, lp.GetName())
				}
			}
		}
	}
}

func TestObserveCallAndUsage(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m := New(reg)

	m.ObserveCall(claudeSonnet, "claude-1", nil, time.Second)
	m.ObserveCall(claudeSonnet, "claude-1", nil, 2*time.Second)
	m.ObserveCall(claudeSonnet, "claude-2", &llm.Error{Class: llm.ClassRateLimited}, 100*time.Millisecond)
	m.AddUsage(openaiGPT4o, llm.Usage{InputTokens: 2_000_000, OutputTokens: 500_000}, Price{InputPerMTok: 2.5, OutputPerMTok: 10})
	m.AddUsage(openaiGPT4o, llm.Usage{}, Price{InputPerMTok: 2.5, OutputPerMTok: 10})

	fams := gather(t, reg)
	calls := func(key, outcome string) float64 {
		return value(t, fams, NameProviderCalls, map[string]string{"provider": "claude", "tier": "sonnet", "key_id": key, "outcome": outcome})
	}
	if got := calls("claude-1", OutcomeOK); got != 2 {
		t.Errorf("ok calls on claude-1 = %v, want 2", got)
	}
	if got := calls("claude-2", OutcomeRateLimited); got != 1 {
		t.Errorf("rate-limited calls on claude-2 = %v, want 1", got)
	}
	if got := value(t, fams, NameProviderLatency, map[string]string{"provider": "claude", "tier": "sonnet"}); got != 3 {
		t.Errorf("latency observations = %v, want 3", got)
	}
	sum := fams[NameProviderLatency].GetMetric()[0].GetHistogram().GetSampleSum()
	if math.Abs(sum-3.1) > 1e-9 {
		t.Errorf("latency sum = %v s, want 3.1", sum)
	}
	tokens := func(dir string) float64 {
		return value(t, fams, NameTokens, map[string]string{"provider": "openai", "tier": "gpt4o", "direction": dir})
	}
	if got := tokens(DirectionInput); got != 2_000_000 {
		t.Errorf("input tokens = %v, want 2000000", got)
	}
	if got := tokens(DirectionOutput); got != 500_000 {
		t.Errorf("output tokens = %v, want 500000", got)
	}
	if got := value(t, fams, NameCostUSD, map[string]string{"provider": "openai", "tier": "gpt4o"}); math.Abs(got-10) > 1e-9 {
		t.Errorf("cost = %v USD, want 10 (2 MTok × 2.5 + 0.5 MTok × 10)", got)
	}
}

func TestInitKeysExposesZeroSeries(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	New(reg).InitKeys("claude-1", "openai-1")
	fams := gather(t, reg)
	for _, name := range []string{NameKeyCooldowns, NameKeysDisabled} {
		for _, id := range []string{"claude-1", "openai-1"} {
			if got := value(t, fams, name, map[string]string{"key_id": id}); got != 0 {
				t.Errorf("%s{key_id=%q} = %v, want 0", name, id, got)
			}
		}
	}
}

func TestNewNilRegisterer(t *testing.T) {
	t.Parallel()
	m := New(nil)
	// The collectors work unregistered.
	m.ObserveCall(claudeSonnet, "claude-1", errors.New("boom"), time.Second)
	m.Coalesced.Inc()
}

func TestNewTwiceOnOneRegistryPanics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	New(reg)
	defer func() {
		if recover() == nil {
			t.Error("second New on the same registry did not panic")
		}
	}()
	New(reg)
}

func TestCost(t *testing.T) {
	t.Parallel()
	sonnet := Price{InputPerMTok: 3, OutputPerMTok: 15}
	tests := []struct {
		name  string
		price Price
		usage llm.Usage
		want  float64
	}{
		{"zero usage", sonnet, llm.Usage{}, 0},
		{"one million input", sonnet, llm.Usage{InputTokens: 1_000_000}, 3},
		{"one million output", sonnet, llm.Usage{OutputTokens: 1_000_000}, 15},
		{"typical call", sonnet, llm.Usage{InputTokens: 1200, OutputTokens: 300}, 0.0036 + 0.0045},
		{"free tier", Price{}, llm.Usage{InputTokens: 5000, OutputTokens: 5000}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Cost(tt.price, tt.usage); math.Abs(got-tt.want) > 1e-12 {
				t.Errorf("Cost(%+v, %+v) = %v, want %v", tt.price, tt.usage, got, tt.want)
			}
		})
	}
}
