#!/bin/sh
# Regenerates after-1500-seeds.txt: the moves simulation (crates/tundra-raft/src/sim/moves.rs)
# on the 1,500 seeds from 50000 at 100 steps each, the run whose seed 50448 failed before
# replicas moved back held their elections (README.md). About 8 minutes on 2 cores.
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-11-30-raft-sim-moves-held
{
    echo "# TUNDRA_SIM_MOVE_SEEDS=1500 TUNDRA_SIM_MOVE_FIRST_SEED=50000 TUNDRA_SIM_MOVE_STEPS=100 cargo test -p tundra-raft -q --lib sim::move_tests::chunks_moved_back_and_forth_under_faults_lose_nothing -- --nocapture"
    echo "# build: $(git rev-parse --short HEAD)"
    TUNDRA_SIM_MOVE_SEEDS=1500 TUNDRA_SIM_MOVE_FIRST_SEED=50000 TUNDRA_SIM_MOVE_STEPS=100 \
        cargo test -p tundra-raft -q --lib sim::move_tests::chunks_moved_back_and_forth_under_faults_lose_nothing -- --nocapture 2>&1 \
        | grep -E '^(seeds=|moves:|test result)|seed [0-9]+:|replay'
} > "$out/after-1500-seeds.txt"
