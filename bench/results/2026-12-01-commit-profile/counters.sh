#!/bin/bash
# The fast journal's counters and the volumes' flushes over 15 s of one sysbench workload on
# tundra-off. Usage: counters.sh WORKLOAD OUTDIR
set -euo pipefail
wl=$1; out=$2; mkdir -p "$out"
out=$(realpath -m "$out"); cd "$(dirname "$0")/../../.."
bench/run --full --databases postgresql --systems tundra-off --workloads "$wl" --repetitions 1 \
  --workload-seconds 35 --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/bench.log" 2>&1 &
bp=$!
for _ in $(seq 600); do grep -q "tables prepared" "$out/bench.log" 2>/dev/null && break; sleep 0.5; done
log=$(ls "$out"/run/logs/*/stack.log)
addr=$(grep -m1 '^native = ' "$log" | sed 's/native = "\(.*\)"/\1/')
sleep 12
target/release/tundra stats --json --addr "$addr" > "$out/before.json"
sleep 15
target/release/tundra stats --json --addr "$addr" > "$out/after.json"
wait $bp || true
grep "tps" "$out/bench.log" | tail -1
python3 - "$out/before.json" "$out/after.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
ja, jb = a["journals"]["fast"], b["journals"]["fast"]
print("fast journal", {k: jb[k] - ja[k] for k in jb if isinstance(jb[k], (int, float))})
for va, vb in zip(a["volumes"], b["volumes"]):
    fa, fb = va["flush"], vb["flush"]
    n = fb["count"] - fa["count"]
    mean = (fb["mean_us"] * fb["count"] - fa["mean_us"] * fa["count"]) / n if n else 0
    writes = vb["page_write"]["count"] - va["page_write"]["count"]
    print(f"volume {vb['name']}: {n} flushes, mean {mean:.0f} us; {writes} writes")
PY
