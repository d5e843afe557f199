package storm

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/llm"
	"bulwark/pkg/redisconn"
	"bulwark/pkg/testkit/redisha"
)

// A short S1 on real processes: 120 distinct prompts from 50 clients
// through the OpenAI endpoint. Every answer must arrive and be right, no
// breaker may open, and at most 2 % of the provider calls may be 429s.
func TestShortStorm(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("storm: builds the binaries and runs redis-server, an api, two workers and the mock for about 30 s; skipped under -short")
	}
	sc, err := NewScenario("S1", 120, 50, 40*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The binaries TestManyProcesses runs too: one build for both.
	res, err := Run(t.Context(), Env{Bins: sharedBinaries(t)}, sc)
	t.Log(res.String())
	if err != nil {
		t.Fatalf("storm: %v", err)
	}
	if res.Answered != res.Total {
		t.Errorf("answered %d of %d correctly (%d wrong); lost by reason: %v", res.Answered, res.Total, res.Wrong, res.Lost)
	}
	if res.BreakerOpenings > 0 {
		t.Errorf("%d breaker openings (%s): Bulwark's own pacing must not trip them", res.BreakerOpenings, strings.Join(res.OpenedBreakers, ", "))
	}
	if res.ProviderCalls == 0 {
		t.Errorf("the mock counted no provider calls")
	} else if share := float64(res.Provider429) / float64(res.ProviderCalls); share > 0.02 {
		t.Errorf("%d of %d provider calls were 429s (%.1f%%, limit 2%%)", res.Provider429, res.ProviderCalls, 100*share)
	}
	if t.Failed() {
		t.Log("process logs:\n" + res.Logs)
	}
}

// TestStormBench is the storm command (`go run ./scripts/storm`) run as a
// test so that `make bench` can start the test services first with
// scripts/test.sh. It runs only with BULWARK_STORM=1; BULWARK_STORM_ARGS
// holds the command's flags.
func TestStormBench(t *testing.T) {
	t.Parallel()
	if os.Getenv("BULWARK_STORM") != "1" {
		t.Skip("storm benchmark: set BULWARK_STORM=1 (make bench does), or run go run ./scripts/storm")
	}
	if code := Main(t.Context(), strings.Fields(os.Getenv("BULWARK_STORM_ARGS")), os.Stdout, os.Stderr); code != 0 {
		t.Fatalf("storm exited %d (lines above)", code)
	}
}

// S4-tpm is bound by tokens: 4 keys × 90,000 TPM at about 1,025 tokens a
// call (prompt + max_tokens 1,000) serve about 5.9 requests a second, below
// the 8 a second their RPM allows; its keys carry that TPM.
func TestTPMScenario(t *testing.T) {
	t.Parallel()
	sc, err := NewScenario(TPMScenario, 300, 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	if c := sc.capacity(); c < 5.7 || c > 5.9 || c >= float64(Keys*KeyRPM)/60 {
		t.Errorf("capacity %.3f requests/s, want about 5.85 (tokens binding)", c)
	}
	if sc.maxTokens() != 1000 || sc.Targets.MaxCallsPerRequest != 1.02 || sc.Targets.MinGoodput != 0.95 {
		t.Errorf("scenario %+v", sc)
	}
	cfg, err := config.Parse([]byte(configYAML(sc, 1, serverYAML("127.0.0.1:2"), "postgres://x@127.0.0.1:3/y", "http://127.0.0.1:4")),
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range cfg.Keys {
		if k.TPMLimit != TPMKeyTPM {
			t.Errorf("key %s tpm_limit %d, want %d", k.ID, k.TPMLimit, TPMKeyTPM)
		}
	}
}

// The generated configuration is what the processes accept.
func TestConfigParses(t *testing.T) {
	t.Parallel()
	for _, name := range ScenarioNames {
		sc, err := NewScenario(name, 400, 50, 0)
		if err != nil {
			t.Fatal(err)
		}
		doc := configYAML(sc, 18080, serverYAML("127.0.0.1:16999"), "postgres://postgres@127.0.0.1:15433/storm_x?sslmode=disable", "http://127.0.0.1:18090")
		env := map[string]string{"BULWARK_STORM_METRICS_LISTEN": "127.0.0.1:19091"}
		cfg, err := config.Parse([]byte(doc), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, doc)
		}
		if got := *cfg.Cache.Enabled; got != sc.Cache {
			t.Errorf("%s: cache enabled %v, want %v", name, got, sc.Cache)
		}
		wantKeys := Keys
		switch {
		case sc.FailPrimary:
			wantKeys = 2 * Keys // the Claude keys of the fallback route too
		case sc.Mixed:
			wantKeys = len(mixedKeys)
		}
		if len(cfg.Keys) != wantKeys || cfg.Worker.MetricsListen != "127.0.0.1:19091" {
			t.Errorf("%s: %d keys, metrics %q", name, len(cfg.Keys), cfg.Worker.MetricsListen)
		}
		if cfg.Queue.MaxConcurrentLLMCalls != config.MaxConcurrentLLMCallsDefault {
			t.Errorf("%s: queue not at its defaults", name)
		}
	}
	// S3-mixed: every kind, each key as mixed.go describes it, the
	// fallback chain and the routing rule.
	sc, err := NewScenario("S3-mixed", 400, 50, 0)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(configYAML(sc, 1, serverYAML("127.0.0.1:2"), "postgres://x@127.0.0.1:3/y", "http://127.0.0.1:4")),
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("S3-mixed: %v", err)
	}
	kinds := map[string]string{}
	for name, p := range cfg.Providers {
		kinds[string(name)] = p.Kind
	}
	if want := map[string]string{"claude": config.KindAnthropic, "bedrock": config.KindBedrock, "azure": config.KindAzure,
		"local": config.KindLocal}; !maps.Equal(kinds, want) {
		t.Errorf("S3-mixed kinds %v, want %v", kinds, want)
	}
	for i, k := range cfg.Keys {
		mk := mixedKeys[i]
		if k.ID != mk.id || string(k.Provider) != mk.provider || k.ModelTier != mk.tier || k.RPMLimit != mk.rpm || k.MaxInFlight != mk.inFlight {
			t.Errorf("S3-mixed key %d: %+v, want %+v", i, k, mk)
		}
	}
	if order := fmt.Sprint(cfg.RouteOrder(llm.Route{Provider: "claude", Tier: "sonnet"}, "router")); order != "[local/qwen claude/sonnet bedrock/sonnet azure/gpt4o]" {
		t.Errorf("S3-mixed: a router request for claude/sonnet tries %s", order)
	}
	if *cfg.Cache.Enabled {
		t.Error("S3-mixed: the cache is on")
	}

	// The api process has no metrics address of its own.
	sc, _ = NewScenario("S1", 1, 1, 0)
	cfg, err = config.Parse([]byte(configYAML(sc, 1, serverYAML("127.0.0.1:2"), "postgres://x@127.0.0.1:3/y", "http://127.0.0.1:4")),
		func(string) (string, bool) { return "", false })
	if err != nil || cfg.Worker.MetricsListen != "off" {
		t.Fatalf("without BULWARK_STORM_METRICS_LISTEN: %v, metrics_listen %q", err, cfg.Worker.MetricsListen)
	}

	// With a Sentinel setup, the processes reach Redis through the
	// sentinels and wait for the replica.
	ha := &sentinelSet{sentinels: redisha.Sentinels{Addrs: []string{"127.0.0.1:5", "127.0.0.1:6"}, MasterName: sentinelMaster}}
	cfg, err = config.Parse([]byte(configYAML(sc, 1, ha.yaml(), "postgres://x@127.0.0.1:3/y", "http://127.0.0.1:4")),
		func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatalf("sentinel: %v", err)
	}
	if rc := cfg.RedisConnConfig(); rc.Mode != redisconn.ModeSentinel || rc.MasterName != sentinelMaster ||
		!slices.Equal(rc.SentinelAddrs, ha.sentinels.Addrs) || rc.MinReplicasAcked != 1 || rc.ReplicaAckTimeout != 500*time.Millisecond {
		t.Errorf("sentinel: redis %+v", rc)
	}
}

func TestPrompts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		n, distinct, crits int
	}{
		{"S1", 400, 400, 0},
		{"S1-slow-async", 400, 400, 20},
		{"S2", 400, 90, 0}, // 10 hot prompts + every fifth request its own
		{"S2", 12, 12, 0},  // 10 hot requests use the 10 hot prompts; 4 and 9 their own
		{"S3-mixed", 400, 400, 0},
		{"F1-fleet-async", 400, 400, 20},
		{"F1-fleet-compat", 400, 400, 20},
	}
	for _, tt := range tests {
		sc, err := NewScenario(tt.name, tt.n, 5, 0)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		crits := 0
		for i, p := range sc.prompts() {
			seen[p] = true
			if sc.priorityOf(i) == "critical" {
				crits++
			}
		}
		if len(seen) != tt.distinct || crits != tt.crits {
			t.Errorf("%s n=%d: %d distinct prompts, %d critical; want %d, %d", tt.name, tt.n, len(seen), crits, tt.distinct, tt.crits)
		}
	}
}

func TestETAErrorAndPercentile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		est, real time.Duration
		want      float64
	}{
		{2 * time.Second, 2 * time.Second, 0},
		{1 * time.Second, 4 * time.Second, 0.75},
		{6 * time.Second, 3 * time.Second, 1},
		{1 * time.Second, 50 * time.Millisecond, 0.95}, // real floored at 1 s
		{0, 200 * time.Millisecond, 0.2},
	}
	for _, tt := range tests {
		if got := etaError(tt.est, tt.real); got < tt.want-1e-9 || got > tt.want+1e-9 {
			t.Errorf("etaError(%s, %s) = %g, want %g", tt.est, tt.real, got, tt.want)
		}
	}
	v := []float64{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	if p50, p95, p100 := percentile(v, 0.5), percentile(v, 0.95), percentile(v, 1); p50 != 5 || p95 != 10 || p100 != 10 {
		t.Errorf("percentiles %g %g %g, want 5 10 10", p50, p95, p100)
	}
	if got := percentile([]time.Duration(nil), 0.99); got != 0 {
		t.Errorf("percentile of nothing = %s", got)
	}
}

func TestMisses(t *testing.T) {
	t.Parallel()
	sc, _ := NewScenario("S1-slow-async", 400, 50, 0)
	good := ErrorStats{N: 400, P50: 0.1, P95: 0.4}
	ok := Result{Total: 400, Answered: 400, Goodput: 0.97, CallsPerRequest: 1, CriticalWaits: 20, CriticalP99: 2 * time.Second,
		ETA: good, ETAFirst: good}
	if m := ok.Misses(sc.Targets); len(m) != 0 {
		t.Errorf("misses of a good result: %v", m)
	}
	bad := Result{Total: 400, Answered: 399, Goodput: 0.5, CallsPerRequest: 1.5, BreakerOpenings: 1, OpenedBreakers: []string{"all"},
		CriticalWaits: 20, CriticalP99: 3 * time.Second, ETA: ErrorStats{N: 400, P50: 0.3, P95: 0.4}, ETAFirst: ErrorStats{N: 400, P50: 0.1, P95: 0.9}}
	if m := bad.Misses(sc.Targets); len(m) != 7 {
		t.Errorf("misses of a bad result: %d %v, want 7", len(m), m)
	}
	s2, _ := NewScenario("S2", 400, 50, 0)
	if m := (Result{Total: 400, Answered: 400, ProviderCalls: 91, DistinctPrompts: 90, CallsPerRequest: 0.23}).Misses(s2.Targets); len(m) != 1 {
		t.Errorf("S2 with one call too many: %v", m)
	}

	s3, _ := NewScenario("S3-mixed", 400, 50, 0)
	routes := map[string]int{"claude/sonnet": 50, "bedrock/sonnet": 150, "azure/gpt4o": 120, "local/qwen": 80}
	good3 := Result{Total: 400, Answered: 400, CallsPerRequest: 1, Routes: routes, LocalMaxInFlight: 2}
	if m := good3.Misses(s3.Targets); len(m) != 0 {
		t.Errorf("misses of a good S3-mixed result: %v", m)
	}
	bad3 := good3
	bad3.Provider429, bad3.Busy, bad3.KeyRefused = 2, 1, map[string]int64{"br-use1": 2, "qwen-1": 1}
	bad3.LocalMaxInFlight, bad3.StrayCalls = 3, 4
	bad3.Routes = map[string]int{"claude/sonnet": 50, "bedrock/sonnet": 150, "azure/gpt4o": 200}
	if m := bad3.Misses(s3.Targets); len(m) != 4 {
		t.Errorf("misses of a bad S3-mixed result: %d %v, want 4", len(m), m)
	}
}

// S3-mixed asks claude/sonnet, claude/sonnet from the router layer and
// azure/gpt4o in turn; every other scenario asks gpt-4o-mini.
func TestMixedAsks(t *testing.T) {
	t.Parallel()
	sc, _ := NewScenario("S3-mixed", 400, 50, 0)
	asks := map[string]int{}
	for i := range sc.Requests {
		model, layer := sc.ask(i)
		asks[model+"@"+layer]++
	}
	if want := map[string]int{"claude/sonnet@": 134, "claude/sonnet@router": 133, "azure/gpt4o@": 133}; !maps.Equal(asks, want) {
		t.Errorf("S3-mixed asks %v, want %v", asks, want)
	}
	if sc.Limit != MixedAutoLimit(400) || MixedCloudCapacity() != 9 {
		t.Errorf("S3-mixed limit %s, cloud capacity %g/s", sc.Limit, MixedCloudCapacity())
	}
	s1, _ := NewScenario("S1", 400, 50, 0)
	if model, layer := s1.ask(7); model != "gpt-4o-mini" || layer != "" || s1.Limit != AutoLimit(400) {
		t.Errorf("S1 asks %q in layer %q, limit %s", model, layer, s1.Limit)
	}
}
