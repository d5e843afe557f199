#!/usr/bin/env bash
# lint.sh runs golangci-lint (configuration: .golangci.yaml) at a pinned
# version, built once per machine from the Go module proxy into the user's
# cache folder (so fresh clones on one machine share it; the first build
# takes one to three minutes on two cores).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=v2.15.0
tools=${XDG_CACHE_HOME:-$HOME/.cache}/bulwark-tools
bin=$tools/golangci-lint-$version
if [ ! -x "$bin" ]; then
  mkdir -p "$tools"
  tmp=$(mktemp -d)
  GOBIN=$tmp go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
  mv "$tmp/golangci-lint" "$bin"
  rmdir "$tmp"
fi
"$bin" run ./...
