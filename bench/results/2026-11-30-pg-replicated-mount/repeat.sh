#!/bin/bash
# Runs run.sh and `KILL_AT=0 dead-node.sh` three times each, alternating, into
# run-N.txt and dead-node-N.txt, then prints each run's tps and seconds at 0 tps and the
# medians with their spread. Usage: bash repeat.sh [TUNDRA_BIN] > summary.txt (root; about 20
# minutes).
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
bin=$(readlink -f "${1:-target/release/tundra}")
for n in 1 2 3; do
  bash "$here/run.sh" "$bin" > "$here/run-$n.txt" 2>&1
  KILL_AT=0 bash "$here/dead-node.sh" "$bin" > "$here/dead-node-$n.txt" 2>&1
done
python3 - "$here" <<'PY'
import re, statistics, sys, pathlib
here = pathlib.Path(sys.argv[1])
def runs(text):
    # Each pgbench run in a file: its tps and the seconds its progress lines show at 0 tps.
    out, zeros = [], []
    for line in text.splitlines():
        m = re.match(r"progress: ([\d.]+) s, ([\d.]+) tps", line)
        if m and float(m.group(2)) == 0.0:
            zeros.append(int(float(m.group(1))))
        m = re.match(r"tps = ([\d.]+)", line)
        if m:
            out.append((float(m.group(1)), zeros)); zeros = []
    return out
def med(values):
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f}, median of {len(values)})"
alone, cluster, ratio, dead = [], [], [], []
for n in (1, 2, 3):
    (a, _), (c, cz) = runs((here / f"run-{n}.txt").read_text())
    (d, dz), = runs((here / f"dead-node-{n}.txt").read_text())
    alone.append(a); cluster.append(c); ratio.append(c / a); dead.append(d)
    print(f"# round {n}: node alone {a:.0f} tps; replicated, node 1 killed 10 s in {c:.0f} tps ({c / a:.2f}x), 0 tps at {cz or 'none'}; replicated, node 1 dead throughout {d:.0f} tps, 0 tps at {dz or 'none'}")
print(f"node alone: {med(alone)} tps")
print(f"replicated, node 1 killed 10 s in: {med(cluster)} tps")
print(f"replicated / node alone, per round: {statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f})")
print(f"replicated, node 1 dead throughout: {med(dead)} tps")
PY
