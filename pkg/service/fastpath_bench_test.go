package service_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"bulwark/pkg/testkit/mockprovider"
)

// BenchmarkCompatPath measures what a client of the OpenAI-compatible
// endpoint sees (issue 15): POST /v1/chat/completions over real HTTP, one
// API and one worker (in this process), real Redis and PostgreSQL, the
// mock provider answering at once with keys no load reaches. Each case
// sends n requests from c concurrent clients after a warm-up and reports
// requests/s, p50 and p99 latency, and what each request cost: Redis
// commands (client calls and, inside Lua scripts, their commands, from
// INFO commandstats), Redis CPU, and this process's CPU (API, worker,
// mock and clients together), and the round trips the API and worker made
// to Redis (a pipeline is one). Run it with -benchtime 1x; `make bench`
// runs it three times. It also reports the Redis memory each request
// leaves behind (used_memory before and after).
//
//	queued/c=32   distinct prompts: cache miss, queue, worker, provider call
//	queued/c=1    the same, one client at a time (latency of the path)
//	hit/c=1       one prompt asked again: exact cache hits
//	hit/c=32      the same, 32 clients
//	limited/c=32  queued, and the first 100 provider calls answer 429
//	              (retry-after 1 ms): each moves its call to another key,
//	              or its task back to the queue while every key cools. Key
//	              cooldowns (key_cooldown 10 ms to 200 ms) and the breaker
//	              (failure_threshold 1000) are set so that the run measures
//	              the 429s' path, not minutes of cooling: compare its cost
//	              per request with queued/c=32's, per 429.
//
// The scale model in docs/performance.md (Redis commands and bytes per request of
// each path) is read from these figures.
func BenchmarkCompatPath(b *testing.B) {
	cases := []benchCase{
		{name: "queued/c=32", clients: 32, n: 2000},
		{name: "queued/c=1", clients: 1, n: 300},
		{name: "hit/c=1", clients: 1, n: 2000, hit: true},
		{name: "hit/c=32", clients: 32, n: 8000, hit: true},
		{name: "limited/c=32", clients: 32, n: 1000, limited: true},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				benchCompat(b, tc)
			}
		})
	}
}

type benchCase struct {
	name         string
	clients, n   int
	hit, limited bool
}

// limited429s is how many calls of limited/c=32 answer 429.
const limited429s = 100

func benchCompat(b *testing.B, tc benchCase) {
	clients, n, hit := tc.clients, tc.n, tc.hit
	b.StopTimer()
	extra := "queue: {queue_max_depth: 20000}"
	if tc.limited {
		extra += "\nkey_cooldown: {base: 10ms, max: 200ms}\nbreaker: {failure_threshold: 1000}"
	}
	s := newSystem(b, opts{quiet: true, keysYML: unlimitedKeys, extraYML: extra})
	s.cfg.Worker.Concurrency = 64
	api := s.startAPI()
	s.startWorker()
	var trips roundTrips
	api.base.Redis.AddHook(&trips)
	s.workers[0].Redis.AddHook(&trips)
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients + 4}}
	url := api.ts.URL + "/v1/chat/completions"
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	prompt := func(i int) string {
		if hit {
			return "is DTC P0300 on the dashboard serious? " + tag
		}
		return fmt.Sprintf("question %d of run %s: what does DTC P0300 mean?", i, tag)
	}
	// Warm-up: connections, prepared statements, and for hits the entry.
	if lat := compatLoad(b, cl, url, min(clients, 8), 50, func(i int) string { return prompt(n + i) }); len(lat) < 50 {
		b.Fatal("warm-up failed")
	}
	rdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr})
	defer rdb.Close()
	if tc.limited {
		if err := s.mock.SetFault(mockprovider.Fault{Provider: "claude", Mode: mockprovider.FaultRateLimit,
			Count: limited429s, RetryAfter: time.Millisecond}); err != nil {
			b.Fatal(err)
		}
	}
	m0 := s.mock.Stats().Total()
	r0 := redisCost(b, rdb)
	t0 := trips.n.Load()
	c0 := processCPU()
	b.StartTimer()
	start := time.Now()
	lat := compatLoad(b, cl, url, clients, n, prompt)
	wall := time.Since(start)
	b.StopTimer()
	cpu := processCPU() - c0
	t1 := trips.n.Load()
	r1 := redisCost(b, rdb)
	if len(lat) != n {
		b.Fatalf("%d of %d requests answered 200", len(lat), n)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(n)/wall.Seconds(), "req/s")
	b.ReportMetric(ms(lat[n/2]), "p50_ms")
	b.ReportMetric(ms(lat[n*99/100]), "p99_ms")
	b.ReportMetric(float64(t1-t0)/float64(n), "redis_trips/req")
	b.ReportMetric(float64(r1.commands-r0.commands)/float64(n), "redis_cmds/req")
	b.ReportMetric(float64(r1.in-r0.in)/float64(n), "redis_in_B/req")
	b.ReportMetric(float64(r1.out-r0.out)/float64(n), "redis_out_B/req")
	// What each request leaves in Redis (its record, event stream and
	// idempotency key, kept server.result_ttl after it ends): the memory a
	// primary needs is this × requests/s × result_ttl.
	b.ReportMetric(float64(r1.mem-r0.mem)/float64(n), "redis_mem_B/req")
	if tc.limited {
		m1 := s.mock.Stats().Total()
		inj := m1.Injected[mockprovider.FaultRateLimit] - m0.Injected[mockprovider.FaultRateLimit]
		b.ReportMetric(float64(inj)/float64(n), "429/req")
		b.ReportMetric(float64(m1.Requests-m0.Requests)/float64(n), "calls/req")
	}
	b.ReportMetric((r1.cpu-r0.cpu).Seconds()*1e6/float64(n), "redis_cpu_us/req")
	b.ReportMetric(cpu.Seconds()*1e3/float64(n), "proc_cpu_ms/req")
}

// compatLoad sends n requests (prompt(i) for the i-th) from clients
// goroutines and returns the latencies of those answered 200.
func compatLoad(b *testing.B, cl *http.Client, url string, clients, n int, prompt func(int) string) []time.Duration {
	var next atomic.Int64
	var mu sync.Mutex
	lat := make([]time.Duration, 0, n)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				body := fmt.Sprintf(`{"model":"claude-sonnet","max_tokens":64,"messages":[{"role":"user","content":%q}]}`, prompt(i))
				req, _ := http.NewRequestWithContext(context.Background(), "POST", url, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+devToken)
				req.Header.Set("Content-Type", "application/json")
				t0 := time.Now()
				resp, err := cl.Do(req)
				if err != nil {
					b.Errorf("request %d: %v", i, err)
					continue
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				d := time.Since(t0)
				if resp.StatusCode != http.StatusOK {
					b.Errorf("request %d: %d %s", i, resp.StatusCode, raw)
					continue
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return lat
}

// redisUse is a Redis server's cumulative work.
type redisUse struct {
	commands int64 // every command executed, those run by scripts too
	in, out  int64 // network bytes received and sent
	cpu      time.Duration
	mem      int64 // used_memory: what the data set holds
}

// redisCost reads INFO commandstats (whose counts include the commands
// scripts run, under their own names) and INFO cpu.
func redisCost(b *testing.B, rdb *redis.Client) redisUse {
	ctx := context.Background()
	var u redisUse
	cmds, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.SplitSeq(cmds, "\n") {
		if _, rest, ok := strings.Cut(line, ":calls="); ok {
			v, _, _ := strings.Cut(rest, ",")
			n, _ := strconv.ParseInt(v, 10, 64)
			u.commands += n
		}
	}
	stats, err := rdb.Info(ctx, "stats").Result()
	if err != nil {
		b.Fatal(err)
	}
	u.in, u.out = int64(infoFloat(stats, "total_net_input_bytes")), int64(infoFloat(stats, "total_net_output_bytes"))
	cpuInfo, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	u.cpu = time.Duration((infoFloat(cpuInfo, "used_cpu_user") + infoFloat(cpuInfo, "used_cpu_sys")) * float64(time.Second))
	memInfo, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	u.mem = int64(infoFloat(memInfo, "used_memory"))
	return u
}

// roundTrips counts a go-redis client's round trips to the server: each
// command, or each pipeline, is one.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.n.Add(1)
		return next(ctx, cmds)
	}
}

func infoFloat(info, field string) float64 {
	f, _ := strconv.ParseFloat(infoField(info, field), 64)
	return f
}

func infoField(info, field string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// processCPU is this process's CPU time so far (user + system).
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkIdleProcesses measures what idle processes cost Redis with no
// traffic at all, in three windows on one system: Redis alone, then with
// an API process (its subscription probe), then with a worker as well
// (asynq's polling of the five queues every worker.task_check_interval,
// its forwarder every delayed_task_check_interval, heartbeats). Each
// process's figure is its window's excess over the one before. The
// docs/performance.md's scale model ("What idle processes cost") is read from it.
func BenchmarkIdleProcesses(b *testing.B) {
	const window = 5 * time.Second
	for range b.N {
		b.StopTimer()
		s := newSystem(b, opts{quiet: true, keysYML: unlimitedKeys})
		rdb := redis.NewClient(&redis.Options{Addr: s.redis.Addr})
		// measure returns Redis's CPU (% of a core) and commands per second
		// over one window, after start-up registrations settle.
		measure := func() (core, cmds float64) {
			time.Sleep(time.Second) // nothing to await: start-up writes end on their own
			r0 := redisCost(b, rdb)
			time.Sleep(window) // the measurement is a rate over this window
			r1 := redisCost(b, rdb)
			return (r1.cpu - r0.cpu).Seconds() / window.Seconds() * 100, float64(r1.commands-r0.commands) / window.Seconds()
		}
		b.StartTimer()
		base, _ := measure()
		s.startAPI()
		api, apiCmds := measure()
		s.startWorker()
		both, bothCmds := measure()
		b.StopTimer()
		_ = rdb.Close()
		b.ReportMetric(base, "redis_alone_core_%")
		b.ReportMetric(api-base, "api_core_%")
		b.ReportMetric(apiCmds, "api_cmds/s")
		b.ReportMetric(both-api, "worker_core_%")
		b.ReportMetric(bothCmds-apiCmds, "worker_cmds/s")
	}
}
