#!/bin/bash
# A follower restarted under PostgreSQL's load, with pre-votes (campaign.rs) and without
# (TUNDRA_TEST_CAMPAIGNS_UNGUARDED=1: replicas campaign on openraft's timer alone), runs
# alternating: ../2026-11-30-pg-replicated-mount/run.sh with ALONE=0 KILL_AT=5 RESTART_AT=15
# (node 1 killed 5 s into pgbench's 30 s and started again 15 s later). Each run keeps its
# file and its nodes' logs; summary.txt counts, per run, the elections of the volumes' chunk
# groups the nodes logged (tundra-member elections.rs), the ones node 1 started after its
# restart, and pgbench's slowest second from the restart on. Usage: bash run.sh [TUNDRA_BIN]
# [ROUNDS] (root; about a minute a run). Another A/B of the same runs sets AB_DIR (where the
# files go), AB_MODES (the two modes' names, the second the one turned off) and AB_OFF (the
# variable set to 1 for the second), as ../2026-12-01-capture-read-ahead/run.sh does.
set -euo pipefail
script_dir=$(cd "$(dirname "$0")" && pwd)
here=$script_dir
[[ -n ${AB_DIR:-} ]] && here=$(mkdir -p "$AB_DIR" && cd "$AB_DIR" && pwd)
modes=${AB_MODES:-pre-vote no-pre-vote}
off=${AB_OFF:-TUNDRA_TEST_CAMPAIGNS_UNGUARDED}
bin=$(readlink -f "${1:-target/release/tundra}")
rounds=${2:-3}
cd "$script_dir/../../.."
for i in $(seq "$rounds"); do
  for mode in $modes; do
    name=run-$i-$mode
    rm -rf "$here/$name-logs"
    setting=()
    [[ $mode == "${modes##* }" ]] && setting=("$off=1")
    env "${setting[@]}" LOGS="$here/$name-logs" ALONE=0 KILL_AT=5 RESTART_AT=15 \
      bash bench/results/2026-11-30-pg-replicated-mount/run.sh "$bin" > "$here/$name.txt" 2>&1 || echo "# run failed: $?" >> "$here/$name.txt"
  done
done
python3 - "$here" > "$here/summary.txt" <<'PY'
import glob, os, re, sys
here = sys.argv[1]
print("# run | chunk-group elections logged (all nodes) | of them after node 1's restart, campaigned by node 1 | pgbench tps, slowest second from 16 s to 25 s | seconds under 300 tps from 16 s to 25 s | tps over the run")
for f in sorted(glob.glob(os.path.join(here, "run-*.txt"))):
    name = os.path.basename(f)[:-4]
    text = open(f).read()
    elections = 0
    for log in glob.glob(os.path.join(here, name + "-logs", "node*.log")):
        elections += sum(1 for l in open(log, errors="replace") if re.match(r"tundra: group 0x[12]000000", l))
    # node 1's log holds both its lives; count its campaigns in the second one.
    after = 0
    log1 = os.path.join(here, name + "-logs", "node1.log")
    if os.path.exists(log1):
        lives = re.split(r"(?m)^tundra: cluster node 1 listening for peers", open(log1, errors="replace").read())
        last = lives[-1] if len(lives) > 1 else ""
        after = sum(1 for l in last.splitlines() if re.match(r"tundra: group 0x[12]000000", l) and "this node campaigned" in l)
    secs = {float(m.group(1)): float(m.group(2)) for m in re.finditer(r"progress: ([\d.]+) s, ([\d.]+) tps", text)}
    slow = min((v for k, v in secs.items() if 16 <= k <= 25), default=float("nan"))
    under = sum(1 for k, v in secs.items() if 16 <= k <= 25 and v < 300)
    tps = re.search(r"tps = ([\d.]+) \(without", text)
    print(f"{name} | {elections} | {after} | {slow:.0f} | {under} | {tps.group(1) if tps else '-'}")
PY
cat "$here/summary.txt"
