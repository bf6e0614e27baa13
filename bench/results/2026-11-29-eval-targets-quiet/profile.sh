#!/bin/sh
# Profiles the whole machine during one full-size PostgreSQL sysbench workload on one Tundra
# stack: perf record -a -g for 8 s, 3 s into a 20 s run. Usage: sh profile.sh [SYSTEM] [WORKLOAD] [OUT]
# (defaults tundra-off, oltp_update_non_index, /tmp/tundra-profile); prints the summary written
# to profile-<system>-<workload>.txt.
set -e
sys=${1:-tundra-off}; wl=${2:-oltp_update_non_index}; out=${3:-/tmp/tundra-profile}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
rm -rf "$out"; mkdir -p "$out"
. "$here/workload.sh"
start_workload "$sys" "$wl" "$out"
sleep 3
node=$(node_pid "$sys")
perf record -a -g -F 499 -o "$out/all.data" -- sleep 8 > /dev/null 2>&1
wait $bench
{
  grep tps "$out/run.log"
  echo "# perf report --no-children --sort comm"
  perf report -i "$out/all.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -25
  echo "# the node's samples by symbol"
  perf report -i "$out/all.data" --no-children --pid "$node" --sort sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -30
} | tee "$here/profile-$sys-$wl.txt"
