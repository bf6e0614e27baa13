#!/bin/bash
# Usage: probe.sh KIND SYSTEM OUTDIR, SYSTEM fuse-null or tundra-off. Runs PostgreSQL
# oltp_update_non_index on SYSTEM (bench/run --full, one 30 s run) and, 12 s after the tables are
# prepared, one probe of the machine while it runs; prints the run's tps and the probe's summary.
#   syscalls: perf trace -s of the serving processes for 3 s (perf-trace-SYSTEM.txt), summed over
#             their threads
#   count:    perf stat -a of ext4 fsyncs, inode writes, block allocations and inode dirtying for
#             10 s (perf-stat-SYSTEM.txt)
#   timeline: perf trace -a of fdatasync, pwrite64 and pread64 for 2 s (timeline-SYSTEM.txt.xz),
#             summed by timeline_summary.py per process kind
#   sched:    perf sched record -a for 2 s, then perf sched latency by mean delay: each task's run
#             time and wake-up delays (sched-latency-SYSTEM.txt)
set -euo pipefail
kind=$1; sys=$2; out=$(realpath -m "$3"); rm -rf "$out"; mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads oltp_update_non_index --repetitions 1 \
  --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
case $kind in
  syscalls)
    pid=$(pgrep -d, -f "target/release/tundra (mount|serve|bench)")
    timeout -s INT 3 perf trace -s -p "$pid" > "$out/trace.txt" 2>&1 || true ;;
  count)
    perf stat -a -e ext4:ext4_sync_file_enter,writeback:writeback_write_inode_start,ext4:ext4_allocate_blocks,ext4:ext4_mark_inode_dirty \
      -o "$out/stat.txt" -- sleep 10 ;;
  timeline)
    timeout -s INT 2 perf trace -a -e fdatasync,pwrite64,pread64 -o "$out/trace.txt" 2>/dev/null || true ;;
  sched)
    perf sched record -o "$out/sched.data" -- sleep 2 > /dev/null 2>&1 || true ;;
  *) echo "probe.sh: unknown kind $kind (syscalls, count, timeline or sched)" >&2; kill "$bp"; exit 2 ;;
esac
wait $bp || true
grep tps "$out/bench.log" | tail -1
case $kind in
  syscalls) python3 - "$out/trace.txt" <<'PY'
import collections, re, sys
total = collections.defaultdict(lambda: [0, 0.0])
for line in open(sys.argv[1]):
    m = re.match(r"\s+(\w+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", line)
    if m and m.group(1) in ("pwrite64", "fdatasync", "pread64", "io_uring_enter", "futex"):
        total[m.group(1)][0] += int(m.group(2))
        total[m.group(1)][1] += float(m.group(4))
for call, (n, ms) in total.items():
    print(call, n, f"avg {1000 * ms / n:.0f} us")
PY
  ;;
  count) grep -E "ext4|writeback" "$out/stat.txt" ;;
  timeline) python3 "$here/timeline_summary.py" "$out/trace.txt" ;;
  sched)
    perf sched latency -i "$out/sched.data" --sort avg 2>/dev/null > "$out/latency.txt" || true
    grep -E "tundra|postgres|TOTAL" "$out/latency.txt" | head -14 ;;
esac
