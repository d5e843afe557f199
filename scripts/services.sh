#!/usr/bin/env bash
# services.sh starts or stops the local Redis and PostgreSQL that Bulwark
# uses, as plain processes with their data under a git-ignored folder.
#
#   scripts/services.sh start|stop|status
#
# Environment (all optional):
#   BULWARK_DATA_DIR    data folder            (default: <repo>/.data/run)
#   BULWARK_REDIS_PORT  Redis loopback port    (default: 16379)
#   BULWARK_PG_PORT     PostgreSQL port        (default: 15432)
#   BULWARK_PG_FAST     1 = fsync off, for throw-away test data
#
# Both servers listen on 127.0.0.1 only. Redis runs with appendonly on.
# PostgreSQL refuses to run as root, so as root it runs as user postgres.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
DATA=${BULWARK_DATA_DIR:-$root/.data/run}
REDIS_PORT=${BULWARK_REDIS_PORT:-16379}
PG_PORT=${BULWARK_PG_PORT:-15432}
PG_BIN=/usr/lib/postgresql/15/bin
DB=bulwark

log() { printf 'services: %s\n' "$*" >&2; }

as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

redis_up() { redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping >/dev/null 2>&1; }
pg_up() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }

start_redis() {
  if redis_up; then return 0; fi
  mkdir -p "$DATA/redis"
  redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --dir "$DATA/redis" \
    --appendonly yes --appendfsync everysec --daemonize yes \
    --databases 64 --save "" --protected-mode yes \
    --maxmemory "${BULWARK_REDIS_MAXMEMORY:-2gb}" --maxmemory-policy noeviction \
    --pidfile "$DATA/redis/redis.pid" --logfile "$DATA/redis/redis.log"
  for _ in $(seq 100); do redis_up && return 0; sleep 0.1; done
  log "redis did not start; see $DATA/redis/redis.log"; exit 1
}

start_pg() {
  if pg_up; then ensure_db; return 0; fi
  local pgdata=$DATA/pg
  mkdir -p "$pgdata"
  [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$pgdata" && chmod 700 "$pgdata"
  if [ ! -f "$pgdata/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 >/dev/null
  fi
  local opts="-c listen_addresses=127.0.0.1 -c port=$PG_PORT -c unix_socket_directories=$pgdata -c max_connections=300"
  if [ "${BULWARK_PG_FAST:-0}" = 1 ]; then
    opts="$opts -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
  fi
  as_pg "$PG_BIN/pg_ctl" -D "$pgdata" -l "$pgdata/server.log" -o "$opts" -w -t 60 start >/dev/null
  ensure_db
}

ensure_db() {
  local psql=("$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -qAt)
  if [ "$("${psql[@]}" -d postgres -c "SELECT 1 FROM pg_database WHERE datname='$DB'")" != 1 ]; then
    "${psql[@]}" -d postgres -c "CREATE DATABASE $DB" >/dev/null
  fi
  "${psql[@]}" -d "$DB" -c "SET client_min_messages=warning; CREATE EXTENSION IF NOT EXISTS vector" >/dev/null
}

stop_all() {
  if redis_up; then redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown >/dev/null 2>&1 || true; fi
  if [ -f "$DATA/pg/postmaster.pid" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$DATA/pg" -m fast -w stop >/dev/null 2>&1 || true
  fi
}

case "${1:-}" in
  start)
    start_redis
    start_pg
    echo "redis://127.0.0.1:$REDIS_PORT postgres://postgres@127.0.0.1:$PG_PORT/$DB?sslmode=disable"
    ;;
  stop) stop_all ;;
  status)
    redis_up && echo "redis up on $REDIS_PORT" || echo "redis down"
    pg_up && echo "postgres up on $PG_PORT" || echo "postgres down"
    ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
