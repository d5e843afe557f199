# The two commands of the README: `make run` and `make test`.
.PHONY: run test build bench lint

run:
	scripts/run.sh

test:
	scripts/test.sh

build:
	go build -o bin/ ./api ./worker ./scheduler ./scripts/mockprovider

# Benchmarks against real Redis/PostgreSQL, without the race detector (see
# README, Performance). BULWARK_BENCH_LARGE=1 adds the 100k-row cases.
bench:
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench . -benchtime 2s -count 3 ./pkg/keypool
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench . -benchtime 1000x -count 3 ./pkg/cache
	BULWARK_RACE=0 BULWARK_KEEP_SERVICES=1 scripts/test.sh -run '^$$' -bench CacheThroughAPI -benchtime 400x -count 3 ./pkg/service
	BULWARK_RACE=0 scripts/test.sh -run '^$$' -bench 'QueuedPath|ThousandStreams' -benchtime 1x -count 3 ./pkg/service

# golangci-lint at a pinned version (also run by `make test`).
lint:
	scripts/lint.sh
