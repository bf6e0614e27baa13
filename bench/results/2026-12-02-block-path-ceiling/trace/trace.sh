#!/bin/bash
# Usage: trace.sh SYSTEM OUTDIR (fuse-null or tundra-off). perf trace -s of the serving processes for 3 s, 12 s into
# PostgreSQL oltp_update_non_index (bench/run --full, one 30 s run); prints the tps and the system calls summed over threads.
set -euo pipefail
sys=$1; out=$(realpath -m "$2"); rm -rf "$out"; mkdir -p "$out"
cd "$(dirname "$0")/../../../.."
bench/run --full --databases postgresql --systems "$sys" --workloads oltp_update_non_index --repetitions 1 \
  --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
sleep 12
pid=$(pgrep -d, -f "target/release/tundra (mount|serve|bench)")
ps -o pid,args -p $pid | cut -c1-200
timeout -s INT 3 perf trace -s -p $pid > $out/trace.txt 2>&1 || true
wait $bp || true
grep tps $out/bench.log | tail -1
python3 - $out/trace.txt <<'PY'
import re,sys,collections
tot=collections.defaultdict(lambda:[0,0.0])
for line in open(sys.argv[1]):
    m=re.match(r"\s+(\w+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)",line)
    if m and m.group(1) in ("pwrite64","fdatasync","pread64","io_uring_enter","futex"):
        tot[m.group(1)][0]+=int(m.group(2)); tot[m.group(1)][1]+=float(m.group(4))
for k,(n,t) in tot.items(): print(k,n,f"avg {1000*t/n:.0f} us")
PY
