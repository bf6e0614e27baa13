#!/bin/sh
# `tundra stats --json` of the node 4 s and 12 s into a 20 s PostgreSQL workload on tundra-off
# (full size): the WAL volume's flush latency between the two is what each commit waits for in
# the node. Usage: sh node-stats.sh [WORKLOAD]; writes node-stats-at-4s.json and -at-12s.json here.
set -e
wl=${1:-oltp_update_non_index}; out=${TMPDIR:-/tmp}/tundra-node-stats
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
rm -rf "$out"; mkdir -p "$out"
. "$here/workload.sh"
start_workload tundra-off "$wl" "$out"
sleep 4
config=$(ps -o args= -p "$(node_pid tundra-off)" | sed 's/.*--config //')
addr=$(grep '^native' "$config" | grep -o '127.0.0.1:[0-9]*')
target/release/tundra stats --json --addr "$addr" > "$here/node-stats-at-4s.json"
sleep 8
target/release/tundra stats --json --addr "$addr" > "$here/node-stats-at-12s.json"
wait $bench
python3 - "$here" <<'PY'
import json, sys
a, b = (json.load(open(f"{sys.argv[1]}/node-stats-at-{t}.json")) for t in ("4s", "12s"))
for va, vb in zip(a["volumes"], b["volumes"]):
    n = vb["flush"]["count"] - va["flush"]["count"]
    mean = (vb["flush"]["count"] * vb["flush"]["mean_us"] - va["flush"]["count"] * va["flush"]["mean_us"]) / max(n, 1)
    print(f"{vb['name']}: {n} flushes in 8 s, {mean:.0f} us each on average")
PY
