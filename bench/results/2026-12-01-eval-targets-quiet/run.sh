#!/bin/sh
# Issue 16's three throughput targets at the full size on a quiet machine: the four systems the
# targets name, both databases, three runs of each sysbench workload, nothing else of ours running.
# Regenerates this directory (report.md, results.json, logs/) and prints the targets.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
cargo build --release -q -p tundra
bench/run --full --databases postgresql,mariadb --systems ext4,btrfs-force,tundra-off,tundra \
    --repetitions 3 --skip-space --skip-store --skip-drive --skip-extras --out "$here"
scripts/eval-targets "$here/results.json" | tee "$here/targets.txt"
