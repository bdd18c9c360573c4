#!/usr/bin/env bash
# Load run (not CI): wrk against examples/axum_server.rs on 127.0.0.1,
# with the limit and without it, bounded in time. Prints a markdown table:
# requests/s, share refused, p50/p99 of admitted requests.
#
#   bash scripts/load.sh [duration_s=10] [connections=128] [capacity=32] [work_ms=5]
#
# Needs wrk (Debian: apt-get install wrk). Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-10}
CONNECTIONS=${2:-128}
CAPACITY=${3:-32}
WORK_MS=${4:-5}
PORT_LIMITED=38181
PORT_FREE=38182
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }

cargo build --release --features tower --example axum_server >/dev/null
BIN=target/release/examples/axum_server

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

"$BIN" --addr 127.0.0.1:$PORT_LIMITED --capacity "$CAPACITY" --work-ms "$WORK_MS" >/dev/null &
pids+=($!)
"$BIN" --addr 127.0.0.1:$PORT_FREE --work-ms "$WORK_MS" --no-limit >/dev/null &
pids+=($!)
for port in $PORT_LIMITED $PORT_FREE; do
  for _ in $(seq 50); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1 # waiting for the server to listen, not synchronising a test
  done
done

run() { # port -> RESULT line
  timeout $((DURATION + 30)) wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --timeout 10s \
    -s scripts/load.lua "http://127.0.0.1:$1/work" | grep '^RESULT'
}
field() { sed -n "s/.*$1=\([^ ]*\).*/\1/p" <<<"$2"; }

limited=$(run $PORT_LIMITED)
free=$(run $PORT_FREE)
echo "wrk -t2 -c$CONNECTIONS -d${DURATION}s on 127.0.0.1, handler = ${WORK_MS} ms of async work, $(nproc) cores shared by client and server"
echo
echo "| server | requests/s | refused | admitted p50 | admitted p99 | split check (ms below/above) |"
echo "|---|---|---|---|---|---|"
for row in "limit $CAPACITY (503 past it):$limited" "no limit:$free"; do
  name=${row%%:*}; line=${row#*:}
  printf '| %s | %s | %.1f%% | %s ms | %s ms | %s / %s |\n' "$name" "$(field rps "$line")" \
    "$(awk "BEGIN{print 100*$(field refused_share "$line")}")" \
    "$(field admitted_p50_ms "$line")" "$(field admitted_p99_ms "$line")" \
    "$(field below_split_ms "$line")" "$(field above_split_ms "$line")"
done
