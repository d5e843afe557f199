#!/usr/bin/env bash
# lint.sh runs golangci-lint (configuration: .golangci.yaml) at a pinned
# version, built once into .data/tools from the Go module proxy.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=v2.15.0
bin=$root/.data/tools/golangci-lint-$version
if [ ! -x "$bin" ]; then
  mkdir -p "$root/.data/tools"
  tmp=$(mktemp -d)
  GOBIN=$tmp go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$version"
  mv "$tmp/golangci-lint" "$bin"
  rmdir "$tmp"
fi
"$bin" run ./...
