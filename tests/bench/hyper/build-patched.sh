#!/usr/bin/env bash
# Builds Spool's release binaries against hyper 1.12.0 with `idle-buffers-1.12.0.patch` (beside
# this script), to measure what an idle HTTP/1.1 event stream costs when hyper gives its head
# and read buffers back while a response body streams (docs/benchmarks-history.md, "Idle HTTP/1.1 streams
# with hyper patched"). The patch is not part of Spool's build: this script builds a copy.
#
# Usage: tests/bench/hyper/build-patched.sh [dir [target dir]]   (default
# /tmp/spool-hyper-patched and <dir>/target; about 10 minutes on 2 cores). Then:
# <target dir>/release/spool-bench p4 --subscribers 10000, and the same with the normal
# build's spool-bench, in one session.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
dir="${1:-/tmp/spool-hyper-patched}"
target="${2:-$dir/target}"
version=1.12.0

src="$(cd "$repo" && cargo metadata --format-version 1 --locked |
  python3 -c 'import json, sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "hyper" and p["version"] == sys.argv[1]:
        print(p["manifest_path"].rsplit("/", 1)[0])' "$version")"
[ -n "$src" ] || { echo "hyper $version is not in Cargo.lock" >&2; exit 1; }

# Only a directory this script made (or a new one) is emptied.
if [ -e "$dir" ] && [ -n "$(ls -A "$dir")" ] && ! [ -d "$dir/spool" -a -d "$dir/hyper" ]; then
  echo "$dir is not empty and not an earlier output of this script: give another directory" >&2
  exit 1
fi
rm -rf "$dir/spool" "$dir/hyper" && mkdir -p "$dir/spool"
cp -r "$src" "$dir/hyper"
(cd "$dir/hyper" && patch -p1 --quiet < "$here/idle-buffers-$version.patch")
# A copy of the committed tree: the patched build rewrites Cargo.lock, which must not touch
# the checkout.
git -C "$repo" archive HEAD | tar -x -C "$dir/spool"
cd "$dir/spool"
CARGO_TARGET_DIR="$target" cargo build --release --workspace --bins \
  --config "patch.crates-io.hyper.path=\"$dir/hyper\""
echo "patched binaries: $target/release (spool-api, spool-worker, spool-bench)"
