#!/usr/bin/env bash
# deps.sh installs what Bulwark needs from Debian when it is missing:
# redis-server, PostgreSQL 15 with its server headers, build tools,
# promtool (Debian's prometheus package), and pgvector built from Debian's
# own pgvector source package (bookworm ships no binary).
#
# It is idempotent: a second run checks and returns in well under a second.
# The Debian mirror is read from the machine's own apt sources; no host
# name is written into the repository.
set -euo pipefail

PG_MAJOR=15
PG_CONFIG=/usr/lib/postgresql/$PG_MAJOR/bin/pg_config
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

log() { printf 'deps: %s\n' "$*" >&2; }

need_pkgs() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  # redis-cli (--cluster create) for the cluster tests; Sentinel is
  # redis-server --sentinel, the same binary.
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  [ -x /usr/lib/postgresql/$PG_MAJOR/bin/postgres ] || missing+=(postgresql-$PG_MAJOR)
  [ -f "$($PG_CONFIG --includedir-server 2>/dev/null)/postgres.h" ] || missing+=(postgresql-server-dev-$PG_MAJOR)
  command -v make >/dev/null 2>&1 && command -v gcc >/dev/null 2>&1 || missing+=(build-essential)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  printf '%s\n' "${missing[@]}"
}

install_pkgs() {
  local pkgs
  pkgs=$(need_pkgs)
  [ -z "$pkgs" ] && return 0
  log "installing: $(echo $pkgs)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
  stop_system_services $pkgs
}

# stop_system_services stops and disables the system-wide servers that the
# packages we just installed start under systemd: Bulwark runs its own
# Redis and PostgreSQL under .data/, and needs only promtool of the
# prometheus package. Services of packages that were already there are
# left alone.
stop_system_services() {
  [ -d /run/systemd/system ] || return 0
  local p unit
  for p in "$@"; do
    case "$p" in
      redis-server) unit=redis-server ;;
      postgresql-*) unit=postgresql ;;
      prometheus) unit=prometheus ;;
      *) continue ;;
    esac
    $SUDO systemctl disable --now "$unit" >/dev/null 2>&1 || true
  done
}

# mirror_uri prints the first Debian archive URI of the machine's apt
# sources (deb822 .sources files first, then one-line sources.list).
mirror_uri() {
  local f uri
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    uri=$(awk '/^URIs:/ {for (i=2;i<=NF;i++) if ($i !~ /security/) {print $i; exit}}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    uri=$(awk '$1=="deb" && $0 !~ /security/ {for (i=2;i<=NF;i++) if ($i ~ /^[a-z+]+:\/\//) {print $i; exit}}' "$f")
    [ -n "$uri" ] && { echo "$uri"; return 0; }
  done
  return 1
}

pgvector_installed() {
  [ -f "$($PG_CONFIG --sharedir)/extension/vector.control" ]
}

build_pgvector() {
  pgvector_installed && return 0
  local uri work
  uri=$(mirror_uri) || { log "no Debian mirror found in the apt sources"; exit 1; }
  work=$(mktemp -d)
  chmod 755 "$work"  # apt drops privileges to _apt for downloads
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$work/apt/lists/partial" "$work/apt/sources" "$work/src"
  echo "deb-src $uri trixie main" > "$work/apt/sources/pgvector.list"
  local opts=(-o Dir::Etc::sourcelist=/dev/null -o "Dir::Etc::sourceparts=$work/apt/sources"
              -o "Dir::State::Lists=$work/apt/lists" -o Debug::NoLocking=1)
  log "building pgvector from Debian's source package"
  apt-get "${opts[@]}" update -qq >/dev/null
  (cd "$work/src" && apt-get "${opts[@]}" source --download-only -qq pgvector >/dev/null)
  local orig
  orig=$(ls "$work"/src/pgvector_*.orig.tar.* | head -n1)
  tar -xf "$orig" -C "$work/src"
  local dir
  dir=$(find "$work/src" -mindepth 1 -maxdepth 1 -type d | head -n1)
  make -s -C "$dir" PG_CONFIG="$PG_CONFIG" >/dev/null
  $SUDO make -s -C "$dir" PG_CONFIG="$PG_CONFIG" install >/dev/null
  pgvector_installed || { log "pgvector did not install"; exit 1; }
}

install_pkgs
build_pgvector
