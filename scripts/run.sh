#!/usr/bin/env bash
# run.sh sets everything up and runs Bulwark against the built-in mock
# provider: installs what is missing, starts Redis and PostgreSQL under
# .data/run, builds and starts the mock provider, api, worker and
# scheduler, and stops all of it on Ctrl-C.
#
# Environment: BULWARK_CONFIG (another config file), BULWARK_DEV_TOKEN
# (default dev-token), BULWARK_ADMIN_TOKEN (default admin-token),
# BULWARK_REDIS_PORT / BULWARK_PG_PORT (16379 / 15432), BULWARK_MOCK_ADDR
# (127.0.0.1:8090), BULWARK_LISTEN (127.0.0.1:8080).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

"$root/scripts/deps.sh"
export BULWARK_DATA_DIR=${BULWARK_DATA_DIR:-$root/.data/run}
export BULWARK_REDIS_PORT=${BULWARK_REDIS_PORT:-16379}
export BULWARK_PG_PORT=${BULWARK_PG_PORT:-15432}
"$root/scripts/services.sh" start >/dev/null

export BULWARK_REDIS_ADDR=127.0.0.1:$BULWARK_REDIS_PORT
export BULWARK_PG_DSN="postgres://postgres@127.0.0.1:$BULWARK_PG_PORT/bulwark?sslmode=disable"
export BULWARK_DEV_TOKEN=${BULWARK_DEV_TOKEN:-dev-token}
export BULWARK_ADMIN_TOKEN=${BULWARK_ADMIN_TOKEN:-admin-token}
export BULWARK_LOG_FORMAT=${BULWARK_LOG_FORMAT:-text}
export BULWARK_MOCK_ADDR=${BULWARK_MOCK_ADDR:-127.0.0.1:8090}
export BULWARK_LISTEN=${BULWARK_LISTEN:-127.0.0.1:8080}
export CLAUDE_BASE_URL=${CLAUDE_BASE_URL:-http://$BULWARK_MOCK_ADDR}
export OPENAI_BASE_URL=${OPENAI_BASE_URL:-http://$BULWARK_MOCK_ADDR}
# Mock keys for the mock provider; real keys only ever come from your
# environment (config.yaml has no default key).
export CLAUDE_API_KEY_1=${CLAUDE_API_KEY_1:-mock-claude-key-1}
export CLAUDE_API_KEY_2=${CLAUDE_API_KEY_2:-mock-claude-key-2}
export OPENAI_API_KEY_PROJECT_A=${OPENAI_API_KEY_PROJECT_A:-mock-openai-key-a}
export OPENAI_API_KEY_PROJECT_B=${OPENAI_API_KEY_PROJECT_B:-mock-openai-key-b}

mkdir -p bin
go build -o bin/ ./api ./worker ./scheduler ./scripts/mockprovider

pids=()
stop() {
  trap - INT TERM EXIT
  echo; echo "stopping..."
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  "$root/scripts/services.sh" stop
  echo "stopped."
}
trap stop INT TERM EXIT

bin/mockprovider & pids+=($!)
bin/api & pids+=($!)
bin/worker & pids+=($!)
bin/scheduler & pids+=($!)

for _ in $(seq 100); do
  curl -fsS "http://$BULWARK_LISTEN/healthz" >/dev/null 2>&1 && break
  sleep 0.1
done

cat <<MSG

Bulwark is running (mock providers at http://$BULWARK_MOCK_ADDR). Ctrl-C stops everything.

  API        http://$BULWARK_LISTEN          (tenant token: $BULWARK_DEV_TOKEN)
  metrics    curl -H 'Authorization: Bearer $BULWARK_ADMIN_TOKEN' http://$BULWARK_LISTEN/metrics
  queues     http://$BULWARK_LISTEN/admin/queues   (admin token: $BULWARK_ADMIN_TOKEN)
  keys       curl -H 'Authorization: Bearer $BULWARK_ADMIN_TOKEN' http://$BULWARK_LISTEN/admin/keys

Try:
  curl -s -H 'Authorization: Bearer $BULWARK_DEV_TOKEN' -H 'Content-Type: application/json' \\
    http://$BULWARK_LISTEN/v1/requests -d '{"provider":"claude","model_tier":"sonnet","priority":"high",
    "messages":[{"role":"user","content":"OTA batch 42 failed with P0A80 on 12 cars. Why?"}]}'
  curl -N -H 'Authorization: Bearer $BULWARK_DEV_TOKEN' http://$BULWARK_LISTEN/v1/requests/<id>/events

MSG
wait -n "${pids[@]}" || true
