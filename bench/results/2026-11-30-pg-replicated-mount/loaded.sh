#!/bin/bash
# dead-node.sh (node 1 killed before pgbench) under load: two shell busy loops take both cores
# for the whole of each run, as builds beside a benchmark do. Usage: bash loaded.sh
# [TUNDRA_BIN] [RUNS] (root; about 3 minutes a run); writes loaded-N.txt here (or in OUT=DIR)
# and keeps each run's node logs in loaded-N-logs/ beside it. A run that makes no progress is
# stopped after 10 minutes.
set -u
here=$(dirname "$(readlink -f "$0")")
out=${OUT:-$here}; mkdir -p "$out"
bin=${1:-target/release/tundra}
for i in $(seq "${2:-6}"); do
  ( while :; do :; done ) & b1=$!
  ( while :; do :; done ) & b2=$!
  LOGS="$out/loaded-$i-logs" timeout 600 bash "$here/dead-node.sh" "$bin" > "$out/loaded-$i.txt" 2>&1
  echo "rc=$?" >> "$out/loaded-$i.txt"
  kill "$b1" "$b2"; wait "$b1" "$b2" 2>/dev/null
done
