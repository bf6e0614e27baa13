#!/bin/bash
# Usage: sched.sh SYSTEM OUTDIR. perf sched record -a for 2 s, 12 s into PostgreSQL oltp_update_non_index
# (bench/run --full, one 30 s run), then perf sched latency sorted by mean delay: each task's run time and wake-up delays.
set -euo pipefail
sys=$1; out=$(realpath -m "$2"); rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads oltp_update_non_index --repetitions 1 \
  --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
perf sched record -o "$out/sched.data" -- sleep 2 > /dev/null 2>&1 || true
wait $bp || true
grep tps "$out/bench.log" | tail -1
perf sched latency -i "$out/sched.data" --sort avg 2>/dev/null > "$out/latency.txt" || true
grep -E "tundra|postgres|TOTAL" "$out/latency.txt" | head -14
