#!/bin/sh
# The raft simulation once appends may be cut short (a third of the seeds cut every append to
# one entry): the 500 default seeds and seeds 500 to 2,499, each file headed by its command and
# the load average before and after. Usage: sh bench/results/2026-11-30-raft-sim-appends-cut/run.sh
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-30-raft-sim-appends-cut
{
  echo "# cargo test -p tundra-raft -q --lib sim::tests::seeds_without_violations -- --nocapture (defaults: 500 seeds x 40 steps)"
  echo "# loadavg before: $(cat /proc/loadavg)"
  cargo test -p tundra-raft -q --lib sim::tests::seeds_without_violations -- --nocapture 2>&1 | grep '^seeds='
  echo "# loadavg after: $(cat /proc/loadavg)"
} > $out/default-500-seeds.txt
{
  echo "# TUNDRA_SIM_SEEDS=2000 TUNDRA_SIM_FIRST_SEED=500 cargo test -p tundra-raft -q --lib sim::tests::seeds_without_violations -- --nocapture (seeds 500 to 2,499 x 40 steps)"
  echo "# loadavg before: $(cat /proc/loadavg)"
  TUNDRA_SIM_SEEDS=2000 TUNDRA_SIM_FIRST_SEED=500 cargo test -p tundra-raft -q --lib sim::tests::seeds_without_violations -- --nocapture 2>&1 | grep '^seeds='
  echo "# loadavg after: $(cat /proc/loadavg)"
} > $out/long-2000-seeds.txt
