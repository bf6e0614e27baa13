#!/bin/sh
# Three runs of the five-node rebalance test, figures appended to raw.txt (first line: this command).
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-28-rebalance/raw.txt
echo "sh bench/results/2026-11-28-rebalance/run.sh" > "$out"
echo "# machine shared with other builds and tests; load average recorded per run" >> "$out"
for run in 1 2 3; do
  echo "run $run" >> "$out"
  TUNDRA_REBALANCE_RAW="$PWD/$out" cargo test -q -p tundra --test cluster_rebalance -- --nocapture > /tmp/rebalance-run$run.log 2>&1
  echo "exit=$?" >> "$out"
done
