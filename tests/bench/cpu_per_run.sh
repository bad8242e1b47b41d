#!/usr/bin/env bash
# CPU per completed run over time, while a spool-bench scenario runs: every INTERVAL seconds,
# the CPU time (utime + stime, from /proc/<pid>/stat) of every postgres process, of spool-api,
# of spool-worker and of redis-server, against the runs completed in the newest spool-bench
# database (`spool_t_*`, the scenario's own; P5 makes one for its pgbench baseline after it,
# so sample P5 during its Spool rounds only). One line per interval: how the cost of a run moves as the tables and
# streams grow (spool-bench prints the CPU split of a scenario's first round only).
#
# Usage: tests/bench/cpu_per_run.sh [SAMPLES] [INTERVAL]   (12 samples, 4 s)
#   e.g. spool-bench p2 --rounds 6 --out DIR & tests/bench/cpu_per_run.sh
# Needs psql and the Postgres the bench uses. Processes are found by name: run nothing else
# with those names meanwhile.
set -euo pipefail

samples="${1:-12}"
interval="${2:-4}"
ticks() { # the CPU ticks of the processes pgrep finds with these arguments
  local total=0 pid
  for pid in $(pgrep "$@" || true); do
    total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat" 2>/dev/null || echo 0)))
  done
  echo "$total"
}
hz="$(getconf CLK_TCK)"
previous=""
for _ in $(seq 1 "$samples"); do
  db="$(psql -h 127.0.0.1 -U root -d postgres -Atc \
    "SELECT datname FROM pg_database WHERE datname LIKE 'spool\\_t\\_%' ORDER BY oid DESC LIMIT 1")"
  runs=0
  if [ -n "$db" ]; then
    runs="$(psql -h 127.0.0.1 -U root -d "$db" -Atc \
      "SELECT count(*) FROM runs WHERE status = 'completed'" 2>/dev/null || echo 0)"
  fi
  current="$runs $(ticks -x postgres) $(ticks -f spool-api) $(ticks -f spool-worker) $(ticks -x redis-server)"
  if [ -n "$previous" ]; then
    echo "$previous $current" | awk -v hz="$hz" '{
      runs = $6 - $1
      if (runs > 0) {
        ms = 1000 / hz / runs
        printf "runs %6d..%6d: CPU per run (ms): postgres %.2f, spool-api %.2f, spool-worker %.2f, redis %.2f\n",
          $1, $6, ($7 - $2) * ms, ($8 - $3) * ms, ($9 - $4) * ms, ($10 - $5) * ms
      }
    }'
  fi
  previous="$current"
  sleep "$interval"
done
