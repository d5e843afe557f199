# The two commands of the README: `make run` and `make test`.
.PHONY: run test build bench lint

run:
	scripts/run.sh

test:
	scripts/test.sh

build:
	go build -o bin/ ./api ./worker ./scheduler ./scripts/mockprovider

# Benchmarks against real Redis/PostgreSQL (see README, Performance).
bench:
	BULWARK_KEEP_SERVICES=0 scripts/test.sh -run '^$$' -bench . -benchtime 2s ./pkg/keypool ./pkg/cache ./pkg/httpapi/...
