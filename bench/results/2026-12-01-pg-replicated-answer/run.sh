#!/bin/bash
# PostgreSQL on replicated volumes with the leader's state machine answering its proposals
# against openraft answering them (TUNDRA_TEST_ANSWER_BY_OPENRAFT=1 in the nodes' environment):
# ../2026-11-30-pg-replicated-mount/run.sh with no node killed (KILL_AT=none), ROUNDS times
# each side, alternating (openraft's answer first in odd rounds), each run with its node alone
# first; run-SIDE-N.txt per run, then each run's tps and the replicated over the node alone.
# Usage (root, from the repository's root; about 4 minutes a run):
#   bash bench/results/2026-12-01-pg-replicated-answer/run.sh [ROUNDS] [TUNDRA_BIN] > bench/results/2026-12-01-pg-replicated-answer/summary.txt
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
rounds=${1:-3}
bin=$(readlink -f "${2:-target/release/tundra}")
one() { # SIDE N
  if [[ $1 == openraft ]]; then
    TUNDRA_TEST_ANSWER_BY_OPENRAFT=1 KILL_AT=none bash "$here/../2026-11-30-pg-replicated-mount/run.sh" "$bin" > "$here/run-$1-$2.txt" 2>&1
  else
    KILL_AT=none bash "$here/../2026-11-30-pg-replicated-mount/run.sh" "$bin" > "$here/run-$1-$2.txt" 2>&1
  fi
}
echo "# bash $0 $rounds $bin; $("$bin" --version 2>/dev/null | head -1); $(nproc) CPUs"
echo "# loadavg before: $(cat /proc/loadavg)"
for n in $(seq 1 "$rounds"); do
  if (( n % 2 )); then one openraft "$n"; one state_machine "$n"; else one state_machine "$n"; one openraft "$n"; fi
done
echo "# loadavg after: $(cat /proc/loadavg)"
python3 - "$here" "$rounds" <<'PY'
import re, statistics, sys, pathlib
here, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
print("side\tround\talone_tps\treplicated_tps\treplicated_over_alone")
ratios = {"state_machine": [], "openraft": []}
for n in range(1, rounds + 1):
    for side in ("openraft", "state_machine"):
        tps = [float(m) for m in re.findall(r"tps = ([\d.]+)", (here / f"run-{side}-{n}.txt").read_text())]
        alone, replicated = tps[0], tps[1]
        ratios[side].append(replicated / alone)
        print(f"{side}\t{n}\t{alone:.0f}\t{replicated:.0f}\t{replicated / alone:.3f}")
for side, r in ratios.items():
    print(f"{side}: replicated over the node alone, median {statistics.median(r):.3f} ({min(r):.3f} to {max(r):.3f}) of {len(r)} rounds")
PY
