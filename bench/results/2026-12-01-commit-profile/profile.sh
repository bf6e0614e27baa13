#!/bin/bash
# System-wide profile of one sysbench workload on one system: perf record -a -g and vmstat
# for 15 s, 12 s into a 35 s run (bench/run's tundra binary, target/release/tundra). Usage: sys.sh SYSTEM WORKLOAD OUTDIR
set -euo pipefail
sys=$1; wl=$2; out=$3; mkdir -p "$out"; out=$(realpath "$out")
cd "$(dirname "$0")/../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads "$wl" --repetitions 1 \
  --workload-seconds 35 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
vmstat 1 15 > "$out/vmstat.txt" &
perf record -a -g -F 999 -o "$out/perf.data" -- sleep 15 > /dev/null 2>&1
wait $bp || true
grep "tps" "$out/bench.log" | tail -1
