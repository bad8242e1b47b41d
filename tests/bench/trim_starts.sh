#!/usr/bin/env bash
# What a busy thread's runs cost Redis as its stream grows: RUNS runs published back to back
# on one thread by the publish script itself (a `message_start` batch, then a `done` batch, as
# a worker sends them), with a retention window of WINDOW_MS. With a short window, every `done`
# after the first window trims the runs that left it (a thread in steady use); with a long one
# (say 3600000), none does and the stream only grows (a thread younger than the window).
# Prints the runs per second one client reached and Redis's CPU per run (INFO's used_cpu over
# the whole feed).
#
# Usage: tests/bench/trim_starts.sh [SCRIPT] [RUNS] [WINDOW_MS]
#   SCRIPT defaults to this checkout's shared/src/stream/publish.lua (give another version's,
#   say from `git show REV:shared/src/stream/publish.lua`, to compare); 20,000 runs; 4 s.
# Needs the Redis the tests use and redis-cli. Leaves no keys behind.
set -euo pipefail
script="$(realpath "${1:-$(dirname "$0")/../../shared/src/stream/publish.lua}")"
runs="${2:-20000}"
window="${3:-4000}"
prefix="trim$$"
stream="$prefix:{t}:events" fence="$prefix:{t}:fence" starts="$prefix:{t}:starts"
commands="$(mktemp)" replies="$(mktemp)"
trap 'rm -f "$commands" "$replies"; redis-cli DEL "$stream" "$fence" "$starts" >/dev/null' EXIT

sha="$(redis-cli SCRIPT LOAD "$(cat "$script")")"
# Run i: workflow w<i>, message m<i>; each batch has an id of its own.
awk -v runs="$runs" -v sha="$sha" -v s="$stream" -v f="$fence" -v st="$starts" \
  -v w="$window" -v c="$prefix:notify" '
  BEGIN {
    for (i = 1; i <= runs; i++) {
      head = sprintf("EVALSHA %s 3 %s %s %s w%d 1 %d %s t", sha, s, f, st, i, w, c)
      printf "%s s%d message_start m%d \"message_start m%d 0 {}\"\n", head, i, i, i
      printf "%s d%d done m%d \"done m%d 0 {}\"\n", head, i, i, i
    }
  }' >"$commands"

cpu() { redis-cli INFO cpu | awk -F: '/^used_cpu_(sys|user):/ {t += $2} END {printf "%.3f", t}'; }
before="$(cpu)"
started="$(date +%s.%N)"
redis-cli <"$commands" >"$replies"
if grep -m 1 ERR "$replies" >&2; then
  echo "the script answered an error" >&2
  exit 1
fi
ended="$(date +%s.%N)"
after="$(cpu)"
fields="$(redis-cli HLEN "$starts")"
awk -v runs="$runs" -v s="$started" -v e="$ended" -v b="$before" -v a="$after" -v h="$fields" \
  -v w="$window" 'BEGIN {
    printf "%d runs in %.1f s: %.0f runs/s; Redis CPU %.1f us per run; starts hash %d fields at the end (window %d ms)\n",
      runs, e - s, runs / (e - s), (a - b) * 1e6 / runs, h, w
  }'
