// Package storm is Bulwark's storm benchmark: it runs Bulwark as separate
// OS processes — the built binaries of ./api, ./worker (two worker
// processes) and ./scripts/mockprovider, with a redis-server of its own and
// a fresh PostgreSQL database — and drives them over HTTP the way a fleet
// of clients would, then reports what the keys' capacity turned into.
//
// # Why processes
//
// The claims under test (keys paced across worker processes, breakers
// shared through Redis, no request lost) are about processes. A harness
// that wires the components into one test binary shares memory, a clock
// and a scheduler among them and can hide exactly what this benchmark
// looks for, so each scenario starts the real binaries, built once and
// without the race detector (Build).
//
// # A scenario's life
//
// Run starts everything afresh for every scenario, so that one scenario's
// breaker, cache or key state cannot leak into the next:
//
//  1. redis-server (from PATH, see scripts/deps.sh) on a free loopback port,
//     no persistence, its files in the scenario's temporary folder;
//  2. a database storm_<random> on the test PostgreSQL server
//     ($BULWARK_TEST_PG, default the `make test` server on port 15433),
//     dropped at the end, with only the pgvector extension created in
//     advance (the processes register its types on every connection,
//     before their migrations would create it); the api and worker
//     processes apply the migrations at start-up (goose, under an
//     advisory lock);
//  3. the mock provider with every key at 120 RPM and a TPM far above the
//     load (MockTPM; S4-tpm's 90,000 binds instead), its latency set by
//     the scenario, and -window 1s when
//     the binary offers that flag (the design's one-second enforcement
//     window; without the flag the mock meters as it always has);
//  4. one api and two worker processes sharing a generated config.yaml
//     (BULWARK_CONFIG): four OpenAI keys on openai/gpt4o-mini with the
//     mock's limits, no Claude keys (the fallback routes exist but hold no
//     capacity), default queue settings, a tenant and an admin token. A
//     scenario may ask for more api and worker processes (Scenario.APIs,
//     Workers; every api after the first listens on a port of its own,
//     BULWARK_STORM_API_LISTEN), other keys and worker concurrency;
//     requests then go to the api processes in turn, each request's
//     submission, events and polls to one.
//
// S3-mixed differs in steps 3 and 4 (mixed.go): its keys are those of
// every provider kind — one Anthropic key on claude/sonnet, whose fallback
// chain is two Bedrock regions then an Azure PTU key and a standard one,
// and a local model's key bounded by max_in_flight — each with a limit of
// its own at the mock, which the mockprovider command cannot set: that
// scenario's mock is served by the storm's own process (mockprovider.New
// with Config.Keys, the local key's MaxConcurrent and the PTU
// deployment), logging to mock.log. The api and worker processes get
// static AWS credentials in their environment for the Bedrock keys'
// SigV4, and no other AWS_ variable.
//
// Every process logs to its own file in the temporary folder; Result.Logs
// holds the last lines of each. Readiness is polled: /readyz on the api,
// /metrics on each worker's metrics address, /mock/stats on the mock.
// When the scenario ends — normally, by its time limit, by a process dying
// or by a panic — every process gets SIGTERM and, 10 s later, SIGKILL; on
// Linux they are also killed if the benchmark process itself dies.
// Everything listens on 127.0.0.1 only.
//
// # Measurements
//
// Each request's answer is checked against mockprovider.Reply of its
// prompt; a wrong answer counts as not answered. Goodput is the answered
// requests over what the keys could have served in the wall time (first
// send to last answer): answered ÷ (wall seconds × Σ rpm/60). Provider
// calls and provider 429s are the mock's own counters (GET /mock/stats).
// S3-mixed also counts the mock's busy 503s (a key at its MaxConcurrent),
// each key's calls and refusals, and the most calls at once on the local
// key, and which route served each answer (X-Bulwark-Provider and
// X-Bulwark-Model-Tier); its goodput counts the cloud routes' answers
// against their keys' capacity (MixedCloudCapacity), as the local route
// has no rate.
// Breaker openings are counted by polling GET /admin/breakers every 500 ms
// and once at the end: every distinct opened_at of a breaker, plus any
// breaker seen open or half-open without one.
//
// The async scenario records every queue estimate a client receives —
// estimated_wait_ms (or, from an older Bulwark, estimated_wait_seconds) of
// the 202 answer and of each SSE `queued` event —
// with the time it arrived, and resolves it at the request's next
// `started` event (the event's own timestamp: same host, same clock). Its
// error is |estimate − real| ÷ max(real, 1 s): a real wait under a second
// is compared with one second rather than letting a 0.05 s start turn an
// estimate 0.3 s off into a 500 % error. Every request of the run counts:
// an estimate no `started` event followed counts against the wait until
// the request ended (failed, or cut at the limit; a lower bound of the
// real wait), and one that arrived after the request's last `started`
// event against a remaining wait of 0 (eta_starved, eta_after_start).
//
// Every client of every scenario is a closed loop: it sends its next
// request when its last one ended (answered or failed).
//
// # The fleet: what a waiting caller sees
//
// F1-fleet-async (/v1/requests and its events) and F1-fleet-compat
// (/v1/chat/completions with X-Bulwark-Priority) run -clients closed-loop
// clients (50), 5 % CRITICAL among LOW (every 20th request), calls of
// 100–300 ms, and measure what a report of the wait for a slot alone
// cannot see (DESIGN, Waiting in line; fleet.go). Each worker calls the
// mock through the recording proxy (callLog), which times every call;
// after the load, the history rows (the requests table) of every request
// Bulwark accepted — id from the 202 or X-Bulwark-Request-Id — give its
// created_at and started_at (read again for up to 20 s until every
// request that ended has its terminal row). Per priority:
//
//   - end-to-end latency p50/p99: submit → answer (or failure) as the
//     client timed it, over the requests that ended (not those cut);
//   - queue wait p50/p99: created_at → started_at (the first slot); a
//     request that never started counts until its end, or until history
//     was read — a lower bound, so a starved request is not left out;
//   - out-of-order starts: over every pair of the same priority and
//     route accepted more than AcceptGap (250 ms) apart, those where the
//     later one started
//     more than OvertakeGap (1 s) before the earlier one (a request that
//     never started starts at its end), with the worst gap.
//
// Besides: LOW's queue-wait p99 ÷ the first-come-first-served ideal,
// clients ÷ capacity (6.25 s for 50 clients on 8/s); the p99 over the
// answered CRITICAL requests of end-to-end latency minus the duration of
// the provider call that answered them (the proxy's start → end of its
// 200); and, async, the queue estimates as below, also as absolute errors
// in seconds. Targets: LOW wait p99 ≤ 1.3 × the ideal, no out-of-order
// start, CRITICAL within its call + 0.3 s at p99, estimates (every one
// and each request's first) within 25 % at the median and 50 % at p95,
// and the paced scenarios' targets (all answered, goodput 0.95, 1.02
// calls per request, no breaker opening). A history row missing for an
// accepted request, or history unreadable, is a miss too.
//
// # Fault matrix
//
// The fault tests (faults_test.go, machinery in faults.go) run the same
// processes — three workers, or Redis with its append-only file on — and
// break something mid-storm: a worker SIGKILLed mid-call ten times, Redis
// restarted, the provider failing part of its calls or all of them for two
// minutes, PostgreSQL down at start-up or stopped for 20 s, an api process
// dying between storing a request and enqueueing it. The workers then
// call the mock through a recording proxy of the test process (callLog,
// one listener per worker, its URL handed to each worker through
// BULWARK_STORM_PROVIDER_URL), which knows every provider call's worker,
// prompt and outcome: which requests a killed worker had in flight, and
// whether a prompt was called again after it had an answer. Each test
// counts, from GET /v1/requests/{id} after the load, that every accepted
// request ended and every answer is its own prompt's, and prints one line
// (FaultResult), appended to $BULWARK_FAULT_REPORT when set.
//
// The PostgreSQL test (faults_postgres_test.go) gives the system a server
// of its own instead of a database on the shared one (postgres.go): a
// cluster initdb'd in the scenario's folder with the binaries
// scripts/services.sh uses ($BULWARK_PG_BIN overrides their folder), on a
// free loopback port, run as user postgres when the tests run as root,
// stopped with a fast shutdown. Besides the counts it checks /readyz (200
// with "degraded": ["postgres"] while the server is away, healthy within
// 30 s of its return) and that every accepted request has a terminal row
// in the requests table within 60 s of its return. The crash test
// (faults_crash_test.go) starts extra api processes with the failpoint
// BULWARK_FAILPOINT=intake-after-store, each on a port of its own
// (BULWARK_STORM_API_LISTEN), and sends the lost request again, with its
// Idempotency-Key, to the api that stays up.
//
// # Running it
//
//	go run ./scripts/storm [-scenarios S1,S1-slow,S1-slow-async,S2,S1-fallback,S3-mixed,F1-fleet-async,F1-fleet-compat,S4-tpm] [-n 400] [-clients 50]
//
// needs the test PostgreSQL server (`make bench` starts it through
// scripts/test.sh and runs TestStormBench, which is the same code path).
// TestShortStorm, part of `make test`, runs a short S1.
//
// # Many processes
//
// scale.go: TestManyProcesses (in `make test`) runs three api and eight
// worker processes on one pool and checks from the mock's own counters
// that no key refused a call and that calls in flight never exceeded the
// global limit; the scale bench (ScaleMain, `make scale`) measures the
// throughput of 1, 2, 4 and 8 workers behind three apis, one system per
// step, up to the keys' capacity.
package storm
