#!/bin/bash
# Two builds of tundra, alternating, on one sysbench workload on tundra-off (bench/run --full,
# one repetition of 30 s per run): tps, and the node's counters over 15 s of the run (12 s after
# the tables are prepared): the WAL volume's flushes and their mean, and the fast journal's group
# commits and the share of them that flushed the data device first.
# Usage: ab.sh BIN_A BIN_B DATABASE WORKLOAD ROUNDS OUTDIR. Needs root. The first build goes first
# in odd rounds, the second in even ones.
set -euo pipefail
a=$1; b=$2; db=$3; wl=$4; rounds=$5; out=$(realpath -m "$6"); mkdir -p "$out"
cd "$(dirname "$0")/../../.."
printf 'round\tbuild\ttps\twal_flushes\twal_flush_mean_us\tgroup_commits\tdata_flush_share\tcheckpoints\n'
one() { # BUILD_NAME BIN ROUND
  local dir="$out/$1-$3"; rm -rf "$dir"; mkdir -p "$dir"
  bench/run --full --databases "$db" --systems tundra-off --workloads "$wl" --repetitions 1 \
    --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$2" \
    --out "$dir/run" > "$dir/bench.log" 2>&1 &
  local bp=$!
  for _ in $(seq 1200); do grep -q "tables prepared" "$dir/bench.log" 2>/dev/null && break; sleep 0.5; done
  local log; log=$(ls "$dir"/run/logs/*/stack.log)
  local addr; addr=$(grep -m1 '^native = ' "$log" | sed 's/native = "\(.*\)"/\1/')
  sleep 12; "$2" stats --json --addr "$addr" > "$dir/before.json"
  sleep 15; "$2" stats --json --addr "$addr" > "$dir/after.json"
  wait $bp || true
  python3 - "$dir" "$1" "$3" <<'PY'
import json, re, sys
d, name, rnd = sys.argv[1:4]
a, b = (json.load(open(f"{d}/{w}.json")) for w in ("before", "after"))
tps = re.findall(r"([0-9.]+) tps", open(f"{d}/bench.log").read())[-1]
ja, jb = a["journals"]["fast"], b["journals"]["fast"]
gc = jb["group_commits"] - ja["group_commits"]
df = jb["data_flushes"] - ja["data_flushes"]
ck = jb["checkpoints"] - ja["checkpoints"]
va = next(v for v in a["volumes"] if v["name"] == "wal")["flush"]
vb = next(v for v in b["volumes"] if v["name"] == "wal")["flush"]
n = vb["count"] - va["count"]
mean = (vb["mean_us"] * vb["count"] - va["mean_us"] * va["count"]) / n if n else 0
print(f"{rnd}\t{name}\t{tps}\t{n}\t{mean:.0f}\t{gc}\t{df / gc if gc else 0:.3f}\t{ck}")
PY
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then one A "$a" "$r"; one B "$b" "$r"; else one B "$b" "$r"; one A "$a" "$r"; fi
done
