#!/bin/bash
# Usage: timeline.sh SYSTEM OUTDIR. perf trace -a of fdatasync, pwrite64 and pread64 for 2 s, 12 s into PostgreSQL
# oltp_update_non_index (bench/run --full, one 30 s run), then timeline_summary.py of it.
set -euo pipefail
sys=$1; out=$(realpath -m "$2"); rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads oltp_update_non_index --repetitions 1 \
  --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
timeout -s INT 2 perf trace -a -e fdatasync,pwrite64,pread64 -o "$out/trace.txt" 2>/dev/null || true
wait $bp || true
grep tps "$out/bench.log" | tail -1
python3 bench/results/2026-12-02-block-path-ceiling/trace/timeline_summary.py "$out/trace.txt"
