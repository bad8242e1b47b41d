#!/usr/bin/env bash
# The benchmark suite of BENCHMARKS.md: a release build of the servers and of spool-bench, then
# spool-bench against locally started api and worker processes (Postgres and Redis as for the
# tests). Arguments go to spool-bench: `--smoke`, `p1 p3`, `--rounds 5`, `--subscribers 1000`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}"
cargo build --release --workspace --bins
exec "$CARGO_TARGET_DIR/release/spool-bench" "$@"
