#!/bin/sh
# Three runs of the leader-balancing test (leader_balance_every = "1s"): a volume of 24
# chunks on three nodes, node 3 killed with kill -9 and restarted under a writer through
# node 1. Each run appends the time from the restart until every node led 8 ± 1 groups, the
# campaigns the balancers started, and the writer's rate (acknowledged 8 KiB page writes a
# second, one at a time) before the kill, while node 3 was down, during balancing and for
# 3 s after, to raw.txt (first line: this command). The machine's load average is noted
# per run: it is shared with other builds. TUNDRA_CARGO_ARGS passes more arguments to cargo
# (these runs: "--target x86_64-unknown-linux-gnu", to build apart from another checkout's
# artifacts in a shared target directory).
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-28-leader-balance/raw.txt
echo "TUNDRA_CARGO_ARGS=\"$TUNDRA_CARGO_ARGS\" sh bench/results/2026-11-28-leader-balance/run.sh" > "$out"
for run in 1 2 3; do
  echo "run $run load_average=$(cut -d' ' -f1-3 /proc/loadavg)" >> "$out"
  TUNDRA_LEADERS_RAW="$PWD/$out" cargo test -q -p tundra --test cluster_leaders $TUNDRA_CARGO_ARGS \
    a_restarted_node_takes_its_share_of_leaders_back_under_writes -- --nocapture \
    > /tmp/leader-balance-run$run.log 2>&1
  echo "exit=$?" >> "$out"
done
