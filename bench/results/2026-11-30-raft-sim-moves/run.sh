#!/bin/sh
# Regenerates this directory's figures: the simulation of chunk moves back and forth under
# faults (crates/tundra-raft/src/sim/moves.rs), the default run and 2,000 more seeds.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-30-raft-sim-moves
run() {
    file=$1; shift
    {
        echo "# $* cargo test -p tundra-raft -q sim::move_tests::chunks_moved_back_and_forth_under_faults_lose_nothing -- --nocapture"
        echo "# loadavg before: $(cat /proc/loadavg)"
        env "$@" cargo test -p tundra-raft -q sim::move_tests::chunks_moved_back_and_forth_under_faults_lose_nothing -- --nocapture 2>&1 \
            | grep -E '^(seeds=|moves:|test result)'
        echo "# loadavg after: $(cat /proc/loadavg)"
    } > "$out/$file"
}
if [ "$1" = soak ]; then
    # `sh run.sh soak`: 4,000 seeds more, about 4 minutes.
    run soak-4000-seeds.txt TUNDRA_SIM_MOVE_SEEDS=4000 TUNDRA_SIM_MOVE_FIRST_SEED=2300
    exit 0
fi
run default-300-seeds.txt TUNDRA_SIM_MOVE_SEEDS=300
run long-2000-seeds.txt TUNDRA_SIM_MOVE_SEEDS=2000 TUNDRA_SIM_MOVE_FIRST_SEED=300
