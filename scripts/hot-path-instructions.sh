#!/usr/bin/env bash
# Instructions per operation on the hot path, counted by callgrind: exact and
# repeatable on a busy machine. For humans: it needs valgrind, which CI
# (`.ci/run`) does not; CI only builds `benches/hot_path.rs`.
#
# Each contender's op is an `#[inline(never)]` function in
# benches/hot_path.rs; callgrind collects only inside it
# (`--toggle-collect`), for two loop lengths, and the difference divided by
# the difference in length is the cost of one op (set-up cancels). The op
# of `empty` is the call and return alone: the floor every figure includes.
# Then the bench's own timed table (ours over the bare pair, one thread).
#
# Usage: scripts/hot-path-instructions.sh [--no-time]
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { echo "valgrind not found" >&2; exit 1; }

out=$(cargo bench --bench hot_path --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*hot_path[^"]*\)".*/\1/p' | tail -1)
[ -x "$out" ] || { echo "could not build benches/hot_path.rs" >&2; exit 1; }

N1=1000
N2=11000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Instructions over `n` calls of contender `name`: collected inside
# `op_<name>` alone, or over the whole program when a third argument says
# `whole` (a loop in the caller, as an independent harness counts).
count() {
  local name=$1 n=$2 scope=${3:-op} file="$tmp/cg.$1.$2"
  local collect=(--toggle-collect="*hot_path::op_$name" --collect-atstart=no)
  [ "$scope" = whole ] && collect=()
  valgrind --tool=callgrind --callgrind-out-file="$file" "${collect[@]}" \
    "$out" "$name" "$n" >/dev/null 2>&1
  sed -n 's/^summary: *\([0-9]*\).*/\1/p; s/^totals: *\([0-9]*\).*/\1/p' "$file" | head -1
}

per_op() {
  local a b
  a=$(count "$1" $N1)
  b=$(count "$1" $N2)
  awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN { printf "%.1f", (b - a) / n }'
}

echo "== hot path, instructions per op (callgrind, $(valgrind --version), $(rustc --version | cut -d' ' -f1-2)) =="
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- src benches || echo ' + local changes')"
empty=$(per_op empty)
for op in admit refuse; do
  ours=$(per_op "ours_$op")
  [ "$op" = admit ] && ours_one=$ours
  tokio=$(per_op "tokio_$op")
  bare=$(per_op "bare_$op")
  net() { awk -v x="$1" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'; }
  case $op in
    admit) label="admission + release"; target=64 ;;
    refuse) label="refusal            "; target=32 ;;
  esac
  echo "$label: sidejob $ours, tokio $tokio, bare pair $bare   (net of the call's $empty: sidejob $(net "$ours"), tokio $(net "$tokio"), bare $(net "$bare"); target sidejob <= $target)"
done
# The refusal inlined into a caller's loop, counted over the whole program
# (no toggle): what a harness that loops on `try_acquire().is_err()` sees,
# its loop's few instructions included, for both.
per_iter() {
  local a b
  a=$(count "$1" $N1 whole)
  b=$(count "$1" $N2 whole)
  awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN { printf "%.1f", (b - a) / n }'
}
echo "refusal in a caller's loop, whole program: sidejob $(per_iter loop_ours_refuse), tokio $(per_iter loop_tokio_refuse)   (each with its loop and black_box, as an independent harness counted; its target for sidejob: <= 32; of sidejob's 32, 21 are the refusal, 7 the caller's handling of the Result (its error byte put in a register the loop carries, the is_err and drop tests) and 4 the loop)"
echo "the same loop over a limiter of capacity 2 over 2 shards in the loop's own frame, as a standalone program has it: sidejob $(per_iter loop_ours_refuse_local)   (two more than above: the thread-local's offset rebuilt in a register each pass, and a jump into the block where the Result's two shapes meet; PERFORMANCE.md, item 12)"
timed=$(per_op ours_admit_timed)
echo "admission + release, timed by an adaptive controller, default sampling: sidejob $timed   (net $(awk -v x="$timed" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); untimed permits under a controller are the plain figure above)"
every=$(per_op ours_admit_timed_every)
echo "admission + release, timed by an adaptive controller, every permit:     sidejob $every   (net $(awk -v x="$every" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'))"
never=$(per_op ours_admit_timed_unsampled)
echo "admission + release, timed by an adaptive controller, none sampled:   sidejob $never   (net $(awk -v x="$never" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); what each unsampled permit pays)"
many=$(per_op ours_admit_many)
echo "admission + release of 4 units at once (try_acquire_many(4)): sidejob $many   (net $(awk -v x="$many" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); $(awk -v m="$many" -v o="$ours_one" -v e="$empty" 'BEGIN { printf "%.2f", (m - e) / (o - e) }')x one unit's instructions; the bench's timed table has the time, target <= 1.2x there)"
with=$(per_op ours_admit_with)
classed=$(per_op ours_admit_classed)
echo "admission + release through acquire_with, one unit: default class $with, Sheddable $classed   (net $(awk -v x="$with" -v e="$empty" 'BEGIN { printf "%.1f", x - e }') and $(awk -v x="$classed" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); the class's take $(awk -v c="$classed" -v w="$with" -v e="$empty" 'BEGIN { printf "%.2f", (c - e) / (w - e) }')x the default class's, target <= 1.3x)"
counted=$(per_op ours_admit_counted)
echo "the same Sheddable take with a min share set (its units counted while held): $counted   (net $(awk -v x="$counted" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); $(awk -v c="$counted" -v w="$with" -v e="$empty" 'BEGIN { printf "%.2f", (c - e) / (w - e) }')x the default class's)"
keyed=$(per_op ours_admit_keyed)
echo "admission + release through acquire_with, one unit of a tenant key: $keyed   (net $(awk -v x="$keyed" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); $(awk -v c="$keyed" -v w="$with" -v e="$empty" 'BEGIN { printf "%.2f", (c - e) / (w - e) }')x the unkeyed acquire_with, $(awk -v c="$keyed" -v w="$ours_one" -v e="$empty" 'BEGIN { printf "%.2f", (c - e) / (w - e) }')x try_acquire; target <= 1.5x plain fail-fast, the unkeyed acquire_with)"
busy=$(per_op ours_admit_keyed_busy)
echo "the same keyed take for a tenant already holding a unit (its word counted up and down): $busy   (net $(awk -v x="$busy" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'); $(awk -v c="$busy" -v w="$with" -v e="$empty" 'BEGIN { printf "%.2f", (c - e) / (w - e) }')x the unkeyed acquire_with)"
room=$(per_op ours_admit_room)
echo "admission + release, idle waiting room: sidejob $room   (net $(awk -v x="$room" -v e="$empty" 'BEGIN { printf "%.1f", x - e }'))"

if [ "${1:-}" != "--no-time" ]; then
  echo
  "$out" --bench
fi
