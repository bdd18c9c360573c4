#!/usr/bin/env bash
# Load run (not CI): examples/load_client.rs against examples/axum_server.rs
# on 127.0.0.1, bounded in time, three ways: limited and failing fast,
# limited with a waiting room, and unlimited. Prints a markdown table:
# requests/s, share refused, p50/p99 of admitted (200) requests, measured
# per status by the client (not estimated from a mixed histogram).
#
#   bash scripts/load.sh [duration_s=5] [connections=128] [capacity=32] [waiters=64] [work_ms=5]
#
# Loopback only; needs nothing but cargo (and curl, to see the servers up).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${1:-5}
CONNECTIONS=${2:-128}
CAPACITY=${3:-32}
WAITERS=${4:-64}
WORK_MS=${5:-5}
PORT_FAST=38181
PORT_QUEUED=38182
PORT_FREE=38183

cargo build --release --features tower --example axum_server --example load_client >/dev/null
SERVER=target/release/examples/axum_server
CLIENT=target/release/examples/load_client

pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT

"$SERVER" --addr 127.0.0.1:$PORT_FAST --capacity "$CAPACITY" --work-ms "$WORK_MS" >/dev/null &
pids+=($!)
"$SERVER" --addr 127.0.0.1:$PORT_QUEUED --capacity "$CAPACITY" --max-waiters "$WAITERS" \
  --work-ms "$WORK_MS" >/dev/null &
pids+=($!)
"$SERVER" --addr 127.0.0.1:$PORT_FREE --work-ms "$WORK_MS" --no-limit >/dev/null &
pids+=($!)
for port in $PORT_FAST $PORT_QUEUED $PORT_FREE; do
  for _ in $(seq 50); do
    curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.1 # waiting for the server to listen, not synchronising a test
  done
done

run() { # port -> RESULT line; one server loaded at a time
  timeout $((DURATION + 30)) "$CLIENT" --url "http://127.0.0.1:$1/work" \
    --connections "$CONNECTIONS" --duration "$DURATION" | grep '^RESULT'
}
field() { sed -n "s/.*[ ]$1=\([^ ]*\).*/\1/p" <<<"$2"; }

fast=$(run $PORT_FAST)
queued=$(run $PORT_QUEUED)
free=$(run $PORT_FREE)
echo "load_client, $CONNECTIONS connections, ${DURATION}s per run on 127.0.0.1; handler = ${WORK_MS} ms of async work; $(nproc) cores shared by client and servers"
echo
echo "(closed loop: a refused connection sends its next request at once, so requests/s counts refusals too; admitted/s is the goodput)"
echo
echo "| server | requests/s | admitted/s | refused (429 / 503) | admitted p50 | admitted p99 | refused p50 | errors |"
echo "|---|---|---|---|---|---|---|---|"
for row in "limit $CAPACITY, fail fast (503):$fast" \
           "limit $CAPACITY + $WAITERS waiting (429 past):$queued" \
           "no limit:$free"; do
  name=${row%%:*}; line=${row#*:}
  printf '| %s | %s | %.0f | %.1f%% (%s / %s) | %s ms | %s ms | %s ms | %s |\n' "$name" "$(field rps "$line")" \
    "$(awk "BEGIN{print $(field rps "$line")*$(field ok "$line")/$(field sent "$line")}")" \
    "$(awk "BEGIN{print 100*$(field refused_share "$line")}")" \
    "$(field r429 "$line")" "$(field r503 "$line")" \
    "$(field ok_p50_ms "$line")" "$(field ok_p99_ms "$line")" \
    "$(field refused_p50_ms "$line")" "$(field errors "$line")"
done
