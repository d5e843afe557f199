# The two commands of the README: `make run` and `make test`.
.PHONY: run test build bench storm scale faults fuzz lint profile

run:
	scripts/run.sh

test:
	scripts/test.sh

build:
	go build -o bin/ ./api ./worker ./scheduler ./scripts/mockprovider

# Benchmarks against real Redis/PostgreSQL, without the race detector (see
# docs/performance.md). BULWARK_BENCH_LARGE=1 adds the 100k-row cases.
bench:
	@scripts/stamp.sh
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench . -benchtime 2s -count 3 ./pkg/keypool
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench . -benchtime 1000x -count 3 ./pkg/cache
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench CacheThroughAPI -benchtime 400x -count 3 ./pkg/service
	BULWARK_RACE=0 scripts/test.sh -run '^$$' -bench 'QueuedPath|ThousandStreams|CompatPath|IdleProcesses|StreamTTFB' -benchtime 1x -count 3 ./pkg/service
	$(MAKE) storm
	$(MAKE) scale

# CPU and block profiles of the queued compat path (BenchmarkCompatPath,
# 32 clients, one API and one worker in the test process, mock answering
# at once) in .data/profile/, and the top of each (docs/performance.md).
# A running process serves the same profiles: /debug/pprof/ on the
# worker's metrics listener, /admin/debug/pprof/ on the API, both behind
# the admin token.
profile:
	mkdir -p .data/profile
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench 'CompatPath/queued/c=32' -benchtime 1x -count 1 \
	  -o $(CURDIR)/.data/profile/service.test -cpuprofile $(CURDIR)/.data/profile/cpu.out -blockprofile $(CURDIR)/.data/profile/block.out ./pkg/service
	go tool pprof -top -cum -nodecount 60 .data/profile/service.test .data/profile/cpu.out | grep -E 'Duration|bulwark/pkg' | head -30
	go tool pprof -top -cum -nodecount 60 .data/profile/service.test .data/profile/block.out | grep -E 'Duration|bulwark/pkg' | head -20

# The storm benchmark alone (docs/performance.md): api, two workers and the
# mock provider as OS processes, nine scenarios (then the closed-loop
# fleet, F1-fleet-async and F1-fleet-compat, and the token-bound S4-tpm),
# about 7.5 minutes; exits 1 when a target is missed. STORM_ARGS passes
# flags (e.g. -scenarios F1-fleet-async or -scenarios S1 -n 120). The
# -timeout is a backstop above the scenarios' 9.5-minute budget plus the
# build.
storm:
	@scripts/stamp.sh
	BULWARK_STORM=1 BULWARK_STORM_ARGS="$(STORM_ARGS)" BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -count=1 -run '^TestStormBench$$' -v -timeout 12m ./pkg/testkit/storm

# The scale bench (docs/performance.md): three api processes and 1, 2, 4,
# 8 workers on one pool, one system per step, one line per step; about
# 1.5 minutes; exits 1 when the throughput does not rise with the workers
# up to the keys' capacity, or a key or the global limit is exceeded.
# SCALE_ARGS passes flags (e.g. -workers 1,2 -seconds 8s).
scale:
	@scripts/stamp.sh
	BULWARK_SCALE=1 BULWARK_SCALE_ARGS="$(SCALE_ARGS)" BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -count=1 -run '^TestScaleBench$$' -v -timeout 6m ./pkg/testkit/storm

# The fault matrix on real processes (docs/operations.md): a worker
# SIGKILLed 10 times mid-storm, Redis restarted mid-storm, PostgreSQL down at
# start-up and stopped mid-run, the API killed between storing and enqueueing
# (a failpoint), provider 5xx/529, a 2-minute provider outage, Sentinel
# failovers (coordinated and a killed master) and, in pkg/service, each
# master of a Redis Cluster killed in turn under traffic. About 6 minutes.
faults:
	@scripts/stamp.sh
	BULWARK_FAULTS=1 BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -count=1 -run '^TestFault' -v -timeout 20m ./pkg/testkit/storm ./pkg/service

# Fuzzing: each target below in turn for FUZZTIME (default 60s), against
# the Redis and PostgreSQL of scripts/test.sh (the pkg/service targets run
# a whole API and worker). `go test -fuzz` takes one package and one target
# at a time. Every target runs even after another failed; a failing input
# is written to the package's testdata/fuzz/<target>/, where `make test`
# replays it: fix the code, or move the input to testdata/fuzz-findings/
# <target>/ (open findings, not replayed) before committing. Each
# target's seed corpus also runs in `make test`, as ordinary tests. New
# interesting inputs stay in Go's cache (go env GOCACHE), not in the tree.
# Minimising an input is capped at 1s: the pkg/service targets see new
# coverage often (the system's own goroutines) and would otherwise spend
# their time minimising instead of fuzzing.
FUZZTIME ?= 60s
FUZZ_TARGETS = \
	pkg/job:FuzzValidEventID \
	pkg/priority:FuzzParse \
	pkg/config:FuzzParse \
	pkg/provider:FuzzDecodeOpenAIRequest \
	pkg/provider:FuzzDecodeAnthropicRequest \
	pkg/provider:FuzzDecodeResponsesRequest \
	pkg/service:FuzzAPIBody \
	pkg/service:FuzzLastEventID \
	pkg/history:FuzzStoredRecord \
	pkg/compactjson:FuzzMarshal

fuzz:
	@failed=; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz: $$name in ./$$pkg for $(FUZZTIME)"; \
	  BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) \
	    -fuzzminimizetime 1s -timeout 30m ./$$pkg || failed="$$failed $$name"; \
	done; \
	if [ -n "$$failed" ]; then echo "fuzz: failing inputs found by$$failed" >&2; exit 1; fi

# golangci-lint at a pinned version (also run by `make test`).
lint:
	scripts/lint.sh
