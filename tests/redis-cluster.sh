#!/usr/bin/env bash
# Starts (if needed) a local 3-master Redis Cluster on 127.0.0.1:7101-7103 and prints the
# REDIS_URL that names it. Used to run the stream tests against a real cluster:
#   SPOOL_TEST_REDIS_URL=$(tests/redis-cluster.sh) cargo test --workspace -- stream
# A cluster that is up and healthy is reused. Anything else (no nodes, some nodes, nodes that
# restarted from a stale nodes.conf and cannot form a cluster again) is torn down and rebuilt
# from empty nodes: they keep no data, so nothing is lost.
set -euo pipefail
dir="${TMPDIR:-/tmp}/spool-redis-cluster"
ports=(7101 7102 7103)

healthy() {
  for port in "${ports[@]}"; do
    redis-cli -p "$port" cluster info 2>/dev/null | grep -q 'cluster_state:ok' || return 1
  done
}

if ! healthy; then
  for port in "${ports[@]}"; do
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 || break; sleep 0.1; done
  done
  rm -rf "$dir"
  for port in "${ports[@]}"; do
    mkdir -p "$dir/$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes \
      --cluster-config-file "$dir/$port/nodes.conf" --dir "$dir/$port" \
      --save "" --appendonly no --daemonize yes --logfile "$dir/$port/redis.log"
  done
  for port in "${ports[@]}"; do
    for _ in $(seq 1 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  done
  redis-cli --cluster create 127.0.0.1:7101 127.0.0.1:7102 127.0.0.1:7103 \
    --cluster-replicas 0 --cluster-yes >/dev/null
  for _ in $(seq 1 100); do healthy && break; sleep 0.1; done
  healthy || { echo "redis cluster did not reach cluster_state:ok; logs in $dir" >&2; exit 1; }
fi
echo "redis://127.0.0.1:7101,redis://127.0.0.1:7102,redis://127.0.0.1:7103"
