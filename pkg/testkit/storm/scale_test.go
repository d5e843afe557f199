package storm

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/priority"
)

// Three api and eight worker processes (the built binaries) on one Redis,
// one database and four keys: 160 async requests, a quarter CRITICAL,
// spread over the api processes in turn, pressing the keys' rate and the
// global concurrency limit at once (ManyScenario). From the mock's own
// counters: no key ever refused a call for its limits (no bucket 429 on
// any key: none was over-subscribed), and never more calls in flight at
// once than queue.max_concurrent_llm_calls, nor fewer than LOW's share of
// it (else the bound went untested); from the workers' metrics, that all
// eight made calls; and from the clients: every accepted request
// completed with its own prompt's answer, each with exactly one provider
// call, and no breaker opened. About 15 s after the build.
//
// The mock meters each key over 2 s, the pool over 1 s (ManyScenario): a
// call then may reach the mock up to half a second away from the moment
// the pool granted it — eleven processes on two cores shared with the
// rest of `make test` — without a 429, while a burst beyond a key's limit
// (a pool whose processes did not share a key's state would send eight
// full buckets at once) or a sustained excess of a second's worth of
// calls is still refused. With 1 s at both, one of four runs under a
// load average of about 10 saw one 429 of 160 calls.
func TestManyProcesses(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("storm: 3 api and 8 worker processes for about 25 s; skipped under -short")
	}
	sc := ManyScenario(160, 60, 40*time.Second)
	res, err := Run(t.Context(), Env{Bins: sharedBinaries(t)}, sc)
	t.Log(res.String())
	if err != nil {
		t.Fatalf("storm: %v", err)
	}
	if res.Answered != res.Total {
		t.Errorf("answered %d of %d correctly (%d wrong); lost by reason: %v", res.Answered, res.Total, res.Wrong, res.Lost)
	}
	if res.Provider429 > 0 || len(res.KeyRefused) > 0 {
		t.Errorf("keys over-subscribed: the mock refused %d calls for their key's limits (by key: %s)", res.Provider429, countsText(res.KeyRefused))
	}
	// The limit is only pressed when CRITICAL takes its reserve beside the
	// LOW requests (15 slots): fewer calls at once than LOW's share would
	// leave the bound unexercised.
	limit := int64(config.MaxConcurrentLLMCallsDefault)
	if res.MaxInFlight > limit {
		t.Errorf("the mock saw %d calls in flight at once; queue.max_concurrent_llm_calls is %d", res.MaxInFlight, limit)
	}
	if low := limit - int64(config.ReservedDefault()[priority.Critical]); res.MaxInFlight < low {
		t.Errorf("the mock saw at most %d calls in flight: the load never pressed the global limit (%d)", res.MaxInFlight, limit)
	}
	if res.ProviderCalls != int64(res.Sent) {
		t.Errorf("%d provider calls for %d requests: want exactly one each", res.ProviderCalls, res.Sent)
	}
	if res.BreakerOpenings > 0 {
		t.Errorf("%d breaker openings (%s)", res.BreakerOpenings, strings.Join(res.OpenedBreakers, ", "))
	}
	if len(res.WorkerCalls) != ManyWorkers {
		t.Errorf("provider calls of %d workers read, want %d: %v", len(res.WorkerCalls), ManyWorkers, res.WorkerCalls)
	}
	for name, n := range res.WorkerCalls {
		if n == 0 {
			t.Errorf("%s made no provider call: the load did not reach every worker (%s)", name, countsText(res.WorkerCalls))
		}
	}
	if t.Failed() {
		t.Log("process logs:\n" + res.Logs)
	}
}

// TestScaleBench is the scale bench (ScaleMain) run as a test, so that
// `make scale` and `make bench` start the test services first with
// scripts/test.sh. It runs only with BULWARK_SCALE=1; BULWARK_SCALE_ARGS
// holds its flags.
func TestScaleBench(t *testing.T) {
	t.Parallel()
	if os.Getenv("BULWARK_SCALE") != "1" {
		t.Skip("scale bench: set BULWARK_SCALE=1 (make scale and make bench do)")
	}
	if code := ScaleMain(t.Context(), strings.Fields(os.Getenv("BULWARK_SCALE_ARGS")), os.Stdout, os.Stderr); code != 0 {
		t.Fatalf("scale bench exited %d (lines above)", code)
	}
}

func TestScaleMisses(t *testing.T) {
	t.Parallel()
	step := func(workers int, rate float64) ScaleStep {
		return ScaleStep{Workers: workers, Result: Result{Total: 100, Answered: 100, SteadyRate: rate, MaxInFlight: 10}}
	}
	tests := []struct {
		name  string
		steps []ScaleStep
		want  int
	}{
		{"rising to capacity", []ScaleStep{step(1, 3.7), step(2, 7.3), step(4, 14.5), step(8, 19.6)}, 0},
		{"capacity reached early, then flat", []ScaleStep{step(1, 8), step(2, 15), step(4, 19.5), step(8, 19.4)}, 0},
		{"flat below capacity", []ScaleStep{step(1, 3.7), step(2, 3.8), step(4, 3.6), step(8, 3.9)}, 3},
		{"capacity never reached", []ScaleStep{step(1, 2), step(2, 4)}, 1},
		{"over capacity", []ScaleStep{step(1, 8), step(2, 16), step(4, 23)}, 1},
		{"short of capacity it could fill", []ScaleStep{step(1, 3.7), step(2, 7.3), step(4, 14.5), step(8, 15)}, 1},
		{"no step", nil, 1},
	}
	for _, tt := range tests {
		if got := scaleMisses(tt.steps, 20, 20); len(got) != tt.want {
			t.Errorf("%s: %d misses %q, want %d", tt.name, len(got), got, tt.want)
		}
	}
	bad := step(8, 19.6)
	bad.Result.Answered, bad.Result.Provider429, bad.Result.MaxInFlight = 99, 2, 21
	if got := scaleMisses([]ScaleStep{step(1, 8), bad}, 20, 20); len(got) != 3 {
		t.Errorf("lost request, 429s, over the limit: %d misses %q, want 3", len(got), got)
	}
}

// The steps' request counts and limits follow the expected rate: the
// load of every step lasts about the same.
func TestScaleScenario(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ workers, n int }{{1, 48}, {2, 96}, {4, 192}, {8, 240}} {
		sc := ScaleScenario(tt.workers, 12*time.Second)
		if sc.Requests != tt.n || sc.capacity() != 20 || sc.Workers != tt.workers || sc.APIs != ScaleAPIs {
			t.Errorf("%d workers: %d requests, capacity %g, %d workers, %d apis; want %d requests", tt.workers, sc.Requests,
				sc.capacity(), sc.Workers, sc.APIs, tt.n)
		}
		doc := configYAML(sc, 1, serverYAML("127.0.0.1:2"), "postgres://x@127.0.0.1:3/y", "http://127.0.0.1:4")
		cfg, err := config.Parse([]byte(doc), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatalf("%d workers: %v\n%s", tt.workers, err, doc)
		}
		if cfg.Worker.Concurrency != ScaleConcurrency || len(cfg.Keys) != ScaleKeys || cfg.Keys[0].RPMLimit != ScaleRPM ||
			cfg.MaxActive()[priority.Normal] != scaleTasks() || scaleTasks() != 2 {
			t.Errorf("%d workers: concurrency %d, %d keys of %d RPM", tt.workers, cfg.Worker.Concurrency, len(cfg.Keys), cfg.Keys[0].RPMLimit)
		}
	}
	if got := fmt.Sprint(ManyScenario(160, 60, 0).capacity()); got != "16" {
		t.Errorf("ManyScenario's keys serve %s requests/s, want 16", got)
	}
}
