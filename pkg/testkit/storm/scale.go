package storm

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"bulwark/pkg/config"
	"bulwark/pkg/priority"
)

// Many processes on one pool (docs/operations.md, "Running on several machines"):
// several api and worker processes share one Redis, one database and one
// set of keys, as they would on several machines.
//
// TestManyProcesses runs ManyScenario: three api and eight worker
// processes, four keys of ManyRPM, calls of about ManyLatency, so that
// both limits are pressed at once — the keys' rate (16 requests/s) and
// the global concurrency limit (20 calls; at 16/s the calls alone hold
// about 19 and the requests waiting for their key's next moment hold the
// rest of the slots). A quarter of the requests are CRITICAL: with LOW
// alone 5 of the 20 slots stay reserved and the limit itself is never
// reached.
//
// The scale bench (ScaleMain, `make scale`) runs one system per step with
// 1, 2, 4 and 8 workers behind three api processes. Each worker runs
// scaleTasks() NORMAL tasks at once (its worker.concurrency of
// ScaleConcurrency less the tasks it keeps for CRITICAL, config.MaxActive)
// and each call takes about ScaleLatency, so a worker serves about
// scaleTasks() ÷ ScaleLatency requests per second — a real worker's
// tasks ÷ a real call's seconds, scaled down — and the keys' ScaleKeys ×
// ScaleRPM cap the sum: the throughput must double with the workers
// until it meets the keys' capacity, and stay there.
const (
	ManyAPIs, ManyWorkers = 3, 8
	ManyKeys, ManyRPM     = 4, 240
	ManyLatency           = 1200 * time.Millisecond

	ScaleAPIs        = 3
	ScaleConcurrency = 4
	ScaleLatency     = 500 * time.Millisecond
	ScaleKeys        = 4
	ScaleRPM         = 300
)

// ManyScenario is TestManyProcesses's storm: n async requests from
// clients clients, every fourth CRITICAL and the others LOW, through
// ManyAPIs api processes to ManyWorkers workers; the mock meters each key
// over 2 s (see TestManyProcesses why), the pool over its default 1 s.
//
// Its workers run ManyConcurrency tasks each, not the default (enough for
// one worker to hold the whole queue): asynq's processor dequeues again at
// once after a task and sleeps only after finding none, so with room for
// every task the first workers to poll take a burst between them and one
// of eight could end with none, which this test checks does not happen.
func ManyScenario(n, clients int, limit time.Duration) Scenario {
	return Scenario{Name: "many", Requests: n, Clients: clients, Mode: Async, CriticalEvery: 4,
		Latency: ManyLatency, Jitter: 200 * time.Millisecond, APIs: ManyAPIs, Workers: ManyWorkers,
		WorkerConcurrency: ManyConcurrency, PoolKeys: ManyKeys, PoolRPM: ManyRPM, MockWindow: 2 * time.Second,
		Limit: limit}
}

// ManyConcurrency is each of ManyScenario's workers' worker.concurrency.
const ManyConcurrency = 32

// ScaleScenario is the scale bench's step with workers workers: about
// seconds of load at the rate the step is expected to reach
// (scaleExpected), at least 40 requests, sent through the OpenAI
// endpoint by 48 clients (three times the most tasks 8 workers run at
// once, so the queue never runs dry), all NORMAL.
func ScaleScenario(workers int, seconds time.Duration) Scenario {
	sc := Scenario{Name: "scale-w" + strconv.Itoa(workers), Clients: 48, Mode: Sync,
		Latency: ScaleLatency, Jitter: 50 * time.Millisecond, APIs: ScaleAPIs, Workers: workers,
		WorkerConcurrency: ScaleConcurrency, PoolKeys: ScaleKeys, PoolRPM: ScaleRPM}
	rate := scaleExpected(workers, sc.capacity())
	sc.Requests = max(40, int(rate*seconds.Seconds()))
	// Twice the expected time, plus start-up ramp and the slowest answers.
	sc.Limit = 2*time.Duration(float64(sc.Requests)/rate*float64(time.Second)) + 15*time.Second
	return sc
}

// scaleExpected is the rate a step of workers workers can reach on paper:
// each worker's tasks at once over the call latency, capped by the keys.
func scaleExpected(workers int, capacity float64) float64 {
	return min(float64(workers*scaleTasks())/ScaleLatency.Seconds(), capacity)
}

// scaleTasks is the NORMAL tasks a worker of ScaleConcurrency runs at
// once: the rest it keeps free for CRITICAL.
func scaleTasks() int {
	c := config.Config{Worker: config.Worker{Concurrency: ScaleConcurrency},
		Queue: config.Queue{Reserved: config.ReservedDefault()}}
	return c.MaxActive()[priority.Normal]
}

// ScaleStep is one step of the scale bench.
type ScaleStep struct {
	Workers int
	Result  Result
	Err     error
}

// String is the step's line: throughput (steady rate), its share of the
// keys' capacity, latency, the mock's most calls in flight and its 429s.
func (s ScaleStep) String() string {
	r := s.Result
	line := fmt.Sprintf("scale: apis=%d workers=%-2d answered=%d/%d req/s=%.2f (%.2f of the keys' capacity) p50=%s p99=%s max_in_flight=%d provider_429=%d calls/req=%.2f",
		ScaleAPIs, s.Workers, r.Answered, r.Total, r.SteadyRate, r.SteadyRate/scaleCapacity(), sec(r.P50), sec(r.P99),
		r.MaxInFlight, r.Provider429, r.CallsPerRequest)
	if lost := r.lostText(); lost != "" {
		line += " lost={" + lost + "}"
	}
	if s.Err != nil {
		line += " ERROR: " + firstLine(s.Err)
	}
	return line
}

// scaleCapacity is the scale bench's keys' requests per second.
func scaleCapacity() float64 { return float64(ScaleKeys*ScaleRPM) / 60 }

// scaleMisses checks the bench's steps, in order of workers, and returns
// every target missed as a sentence:
//
//   - every request answered, no provider 429 (no key over-subscribed),
//     the mock's most calls in flight within the global limit;
//   - the shape: a step whose workers cannot fill the keys serves at
//     least 80 % of its workers times the first step's rate per worker
//     (what a worker does on this machine, not on paper); a step whose
//     workers can fill them reaches 85 % of their capacity; none exceeds
//     it by more than 10 % (the keys' one-second burst over a span of
//     about ten seconds; measured: 3 % over);
//   - at least one step where the keys are the limit.
func scaleMisses(steps []ScaleStep, capacity float64, maxInFlight int64) []string {
	var out []string
	if len(steps) == 0 {
		return []string{"no step ran"}
	}
	perWorker := steps[0].Result.SteadyRate / float64(steps[0].Workers)
	capped := false
	for _, s := range steps {
		r, name := s.Result, fmt.Sprintf("%d workers", s.Workers)
		if s.Err != nil {
			out = append(out, fmt.Sprintf("%s: %v", name, firstLine(s.Err)))
			continue
		}
		if r.Answered != r.Total {
			out = append(out, fmt.Sprintf("%s: answered %d of %d", name, r.Answered, r.Total))
		}
		if r.Provider429 > 0 {
			out = append(out, fmt.Sprintf("%s: %d provider 429s (keys over-subscribed: %s)", name, r.Provider429, countsText(r.KeyRefused)))
		}
		if r.MaxInFlight > maxInFlight {
			out = append(out, fmt.Sprintf("%s: %d calls in flight at once at the provider > the global limit %d", name, r.MaxInFlight, maxInFlight))
		}
		switch expected := perWorker * float64(s.Workers); {
		case expected >= capacity:
			capped = true
			if r.SteadyRate < 0.85*capacity {
				out = append(out, fmt.Sprintf("%s: %.2f requests/s < 85%% of the keys' %.2f/s, which they could fill", name, r.SteadyRate, capacity))
			}
		case r.SteadyRate < 0.8*expected:
			out = append(out, fmt.Sprintf("%s: %.2f requests/s < 80%% of %d × the first step's %.2f per worker", name, r.SteadyRate, s.Workers, perWorker))
		}
		if r.SteadyRate > 1.1*capacity {
			out = append(out, fmt.Sprintf("%s: %.2f requests/s > the keys' %.2f/s", name, r.SteadyRate, capacity))
		}
	}
	if !capped {
		out = append(out, fmt.Sprintf("no step had workers enough to fill the keys (%.2f requests/s per worker, %.2f/s of keys)", perWorker, capacity))
	}
	return out
}

// ScaleMain is the scale bench (`make scale`, TestScaleBench): it parses
// args, builds the binaries, runs one step per worker count, prints one
// line per step and then the targets missed, and returns the exit code:
// 0 when every target was met, 1 when one was missed, 2 for bad
// arguments.
func ScaleMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	list := fs.String("workers", "1,2,4,8", "worker processes of each step, rising")
	seconds := fs.Duration("seconds", 12*time.Second, "load of each step, at its expected rate")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	var counts []int
	for f := range strings.SplitSeq(*list, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 || (len(counts) > 0 && w <= counts[len(counts)-1]) {
			printf(stderr, "scale: -workers %q: want rising counts of at least 1\n", *list)
			return 2
		}
		counts = append(counts, w)
	}
	binDir, err := os.MkdirTemp("", "bulwark-scale-bin-*")
	if err != nil {
		printLine(stderr, "scale:", err)
		return 1
	}
	defer func() { _ = os.RemoveAll(binDir) }()
	printLine(stderr, "scale: building ./api ./worker ./scripts/mockprovider (no -race) …")
	bins, err := Build(ctx, binDir)
	if err != nil {
		printLine(stderr, err)
		return 1
	}
	printf(stdout, "scale: %d api processes; %d keys x %d RPM = %.0f requests/s; each worker %d NORMAL tasks at once (concurrency %d), calls of %s (at most %.0f requests/s per worker); global limit %d calls\n",
		ScaleAPIs, ScaleKeys, ScaleRPM, scaleCapacity(), scaleTasks(), ScaleConcurrency, ScaleLatency,
		float64(scaleTasks())/ScaleLatency.Seconds(), config.MaxConcurrentLLMCallsDefault)
	env := Env{Bins: bins, PGAdminDSN: PGAdminDSN()}
	var steps []ScaleStep
	for _, w := range counts {
		res, err := Run(ctx, env, ScaleScenario(w, *seconds))
		step := ScaleStep{Workers: w, Result: res, Err: err}
		printLine(stdout, step.String())
		if err != nil {
			printf(stderr, "%s", res.Logs)
		}
		steps = append(steps, step)
		if ctx.Err() != nil {
			break
		}
	}
	misses := scaleMisses(steps, scaleCapacity(), config.MaxConcurrentLLMCallsDefault)
	if len(misses) == 0 {
		printLine(stdout, "scale: every target met")
		return 0
	}
	printLine(stdout, "scale: targets missed:")
	for _, m := range misses {
		printLine(stdout, "  "+m)
	}
	return 1
}
