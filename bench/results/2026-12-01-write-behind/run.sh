#!/bin/bash
# Two builds of tundra against ext4 under the single-statement write workloads, in alternating
# rounds: each round runs `bench/run --full` for PostgreSQL and MariaDB on ext4 and tundra-off
# with BIN_A, then on tundra-off with BIN_B (four sysbench write workloads, 3 repetitions each).
# Usage: bash run.sh BIN_A BIN_B OUT_DIR [ROUNDS]  (ROUNDS defaults to 2; about 35 min a round)
# then: python3 summarize.py OUT_DIR > summary.txt. Needs root.
set -euo pipefail
a=$(realpath "$1"); b=$(realpath "$2"); out=$3; rounds=${4:-2}
root=$(cd "$(dirname "$0")/../../.." && pwd)
workloads=oltp_write_only,oltp_update_index,oltp_update_non_index,oltp_insert
common=(--full --databases postgresql,mariadb --workloads "$workloads" --repetitions 3
        --skip-space --skip-store --skip-drive --skip-extras)
mkdir -p "$out"
for round in $(seq "$rounds"); do
  "$root/bench/run" "${common[@]}" --systems ext4,tundra-off --tundra-bin "$a" --out "$out/A-$round"
  "$root/bench/run" "${common[@]}" --systems tundra-off --tundra-bin "$b" --out "$out/B-$round"
done
