#!/usr/bin/env bash
# Instructions per `call_async` round trip, counted by callgrind: exact and
# repeatable on a busy machine. For humans: it needs valgrind, which CI
# (`.ci/run`) does not; CI only builds `benches/async_dispatch.rs`.
#
# Each contender runs in the bench's `probe` mode: its round trips alone, on
# a runtime of one thread (so the count is the same every run), for two
# numbers of calls; the difference in instructions over the difference in
# calls is the cost of one round trip, everything else (the runtime, the
# pool, the tasks) cancelling out. Two runtimes: current-thread (`ct`), and
# the multi-thread scheduler with one worker thread (`mt1`), where the
# async pool takes its multi-thread path (a worker yields once before it
# sleeps). The actor idiom is tokio's: a task per worker fed by a bounded
# mpsc, a oneshot for the reply. The pools: 2 workers at capacity 64
# (default dispatch, and `steal(false)`), and the worker count a user gets
# by not naming one (one per unit of capacity: 64 workers).
#
# Beside each count, in brackets, the locked read-modify-writes per round
# trip (callgrind's `--collect-bus=yes` "global bus events": a `lock`ed
# instruction or an `xchg` with memory; a lock's take and its release are
# one each). Callgrind counts each as one instruction; the CPU pays some
# 20 cycles for one, more when its line was last written by another core.
#
# Usage: scripts/round-trip-instructions.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 1; }

out=$(cargo bench --all-features --bench async_dispatch --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*async_dispatch[^"]*\)".*/\1/p' | tail -1)
[ -x "$out" ] || { echo "could not build benches/async_dispatch.rs" >&2; exit 1; }

N1=6400
N2=25600
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Instructions and locked instructions of the whole run of
# `probe <name> <tasks> <n> <runtime>`, as "Ir Ge".
count() {
  local file="$tmp/cg.$1.$2.$3.$4"
  valgrind --tool=callgrind --collect-bus=yes --callgrind-out-file="$file" "$out" probe "$1" "$2" "$3" "$4" >/dev/null 2>&1
  sed -n 's/^summary: *\([0-9]*\) *\([0-9]*\).*/\1 \2/p; s/^totals: *\([0-9]*\) *\([0-9]*\).*/\1 \2/p' "$file" | head -1
}

# Per round trip: "<instructions> [<locked instructions>]".
per_call() {
  local a b
  a=$(count "$1" "$2" $N1 "$3")
  b=$(count "$1" "$2" $N2 "$3")
  awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN {
    split(a, x, " "); split(b, y, " ")
    printf "%.0f [%.1f]", (y[1] - x[1]) / n, (y[2] - x[2]) / n
  }'
}

# The ratio of two per_call figures' instructions.
ratio() {
  awk -v o="${1%% *}" -v a="${2%% *}" 'BEGIN { printf "%.3f", o / a }'
}

echo "== call_async round trip, instructions [locked instructions] per call (callgrind, $(valgrind --version), $(rustc --version | cut -d' ' -f1-2), capacity 64, 2 workers unless said) =="
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src benches || echo ' + local changes')"
for rt in ct mt1; do
  for tasks in 1 64; do
    actor=$(per_call actor $tasks $rt)
    pool=$(per_call pool $tasks $rt)
    own=$(per_call pool_own $tasks $rt)
    dflt=$(per_call pool_dflt $tasks $rt)
    printf '%-3s %2s task(s): tokio actor %s, async pool default %s (%sx), steal(false) %s (%sx), 64 workers %s (%sx)\n' \
      "$rt" "$tasks" "$actor" "$pool" "$(ratio "$pool" "$actor")" \
      "$own" "$(ratio "$own" "$actor")" \
      "$dflt" "$(ratio "$dflt" "$actor")"
  done
done
