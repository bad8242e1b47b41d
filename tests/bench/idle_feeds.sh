#!/usr/bin/env bash
# What idle followers cost Redis: one spool-api (no worker, so every run stays queued), N
# threads with a queued run each and one SSE follower each, then the gateway's XRANGE calls
# per second per followed thread over an idle window (from Redis's INFO commandstats).
#
# Usage: tests/bench/idle_feeds.sh [BIN_DIR] [THREADS] [IDLE_SECS]
#   BIN_DIR defaults to the release build ($CARGO_TARGET_DIR/release); 200 threads; 40 s.
# Needs the Postgres and Redis the tests use, curl and redis-cli. Prints one line of figures.
set -euo pipefail

bin="${1:-${CARGO_TARGET_DIR:-$HOME/.cache/spool/target}/release}"
threads="${2:-200}"
idle="${3:-40}"
port=$((20000 + RANDOM % 20000))
run="idle$$"
export DATABASE_URL="postgres://root@127.0.0.1:5432/spool_$run"
export SPOOL_REDIS_PREFIX="$run"
export SPOOL_API_ADDR="127.0.0.1:$port"
export SPOOL_SSE_MAX_STREAMS_PER_USER=0 # one user follows every thread
export SPOOL_SSE_MAX_STREAMS=0
base="http://$SPOOL_API_ADDR"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  dropdb -h 127.0.0.1 -U root --if-exists "spool_$run" >/dev/null 2>&1 || true
}
trap cleanup EXIT

"$bin/spool-api" serve >"/tmp/$run-api.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do
  curl -sf "$base/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -sf "$base/readyz" >/dev/null || { echo "spool-api did not start: /tmp/$run-api.log" >&2; exit 1; }
token="$("$bin/spool-api" token --sub idle --tenant idle)"

for _ in $(seq 1 "$threads"); do
  thread="$(cat /proc/sys/kernel/random/uuid)"
  curl -sf -X POST "$base/v1/threads/$thread/user_message" \
    -H "Authorization: Bearer $token" -H "Content-Type: application/json" \
    -d '{"input_text": "wait"}' >/dev/null
  curl -sN "$base/v1/threads/$thread/stream" -H "Authorization: Bearer $token" >/dev/null 2>&1 &
  pids+=($!)
done

xrange_calls() {
  redis-cli -h 127.0.0.1 -p 6379 INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_xrange:calls=\([0-9]*\),.*/\1/p'
}
sleep 3 # the followers' own first reads
before="$(xrange_calls)"
sleep "$idle"
after="$(xrange_calls)"
awk -v d="$((after - before))" -v n="$threads" -v s="$idle" 'BEGIN {
  printf "idle feeds: %d followed threads, %d s: %d XRANGE calls, %.2f per second, %.3f per thread per second\n", n, s, d, d / s, d / s / n
}'
