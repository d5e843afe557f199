#!/usr/bin/env bash
# test.sh runs the whole test suite against real Redis and PostgreSQL:
# installs what is missing, starts both under .data/test on their own
# ports (fsync off: throw-away data), runs `go test -race ./...`, and stops
# them again. Extra arguments go to `go test` (e.g. -run TestX ./pkg/job).
# BULWARK_RACE=0 leaves out -race (benchmarks: the race detector distorts
# timings several-fold).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

"$root/scripts/deps.sh"
export BULWARK_DATA_DIR=${BULWARK_TEST_DATA_DIR:-$root/.data/test}
export BULWARK_REDIS_PORT=${BULWARK_TEST_REDIS_PORT:-16380}
export BULWARK_PG_PORT=${BULWARK_TEST_PG_PORT:-15433}
export BULWARK_PG_FAST=1
"$root/scripts/services.sh" start >/dev/null
if [ "${BULWARK_KEEP_SERVICES:-0}" != 1 ]; then
  trap '"$root/scripts/services.sh" stop' EXIT
fi
export BULWARK_TEST_REDIS=127.0.0.1:$BULWARK_REDIS_PORT
export BULWARK_TEST_PG="postgres://postgres@127.0.0.1:$BULWARK_PG_PORT/postgres?sslmode=disable"

race=-race
[ "${BULWARK_RACE:-1}" = 0 ] && race=
if [ $# -gt 0 ]; then
  go test $race "$@"
  exit
fi

# The whole suite: formatting, the tests, then the linters.
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.data/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2; echo "$unformatted" >&2; exit 1
fi
# -count=1: the results depend on the live servers; never reuse cached ones.
go test $race -count=1 -timeout 9m ./...
if [ "${BULWARK_LINT:-1}" = 1 ]; then
  "$root/scripts/lint.sh"
fi
