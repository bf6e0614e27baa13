#!/bin/bash
# Usage: count.sh SYSTEM OUTDIR. perf stat -a of ext4 fsyncs, inode writes, block allocations and inode dirtying for
# 10 s, 12 s into PostgreSQL oltp_update_non_index (bench/run --full, one 30 s run).
set -euo pipefail
sys=$1; out=$(realpath -m "$2"); rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads oltp_update_non_index --repetitions 1 \
  --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
perf stat -a -e ext4:ext4_sync_file_enter,writeback:writeback_write_inode_start,ext4:ext4_allocate_blocks,ext4:ext4_mark_inode_dirty -o $out/stat.txt -- sleep 10
wait $bp || true
grep tps $out/bench.log | tail -1; grep -E "ext4|writeback" $out/stat.txt
