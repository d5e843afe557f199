#!/usr/bin/env bash
# stamp.sh prints the line every bench target starts with, so that a
# figure copied into docs/performance.md names the code and the machine
# it was measured on: the commit (with "+changes" when the worktree
# differs from it), the CPU, cores, memory, Go and the time.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit+changes"
fi
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
mem=$(awk '/^MemTotal:/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)
echo "bench: commit $commit; ${cpu:-unknown CPU}, $(nproc) cores, ${mem:-? GiB}; $(go env GOVERSION); $(date -u +%Y-%m-%dT%H:%MZ)"
