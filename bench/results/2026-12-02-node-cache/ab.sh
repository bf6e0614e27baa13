#!/bin/bash
# tundra-off with the node's page cache at A or at B bytes per device (TUNDRA_BENCH_NODE_PAGE_BYTES,
# bench/eval/stacks.py; the database's memory budget gets what the node's caches do not take),
# alternating which goes first, one 30 s run of bench/run --full per round and setting; prints
# round, setting and tps. TUNDRA_BIN: the binary (default target/release/tundra). Needs root.
# Usage: ab.sh DATABASE WORKLOAD ROUNDS OUTDIR BYTES_A BYTES_B
set -euo pipefail
db=$1; wl=$2; rounds=$3; out=$(realpath -m "$4"); a=$5; b=$6; mkdir -p "$out"
cd "$(dirname "$0")/../../.."
one() { local dir=$out/$1-$3; rm -rf $dir
  TUNDRA_BENCH_NODE_PAGE_BYTES=$2 bench/run --full --databases $db --systems tundra-off --workloads $wl --repetitions 1 \
    --workload-seconds 30 --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "${TUNDRA_BIN:-target/release/tundra}" --out $dir > $dir.log 2>&1 || true
  printf '%s\t%s\t%s\n' "$3" "$1" "$(grep -oE '[0-9.]+ tps' $dir.log | tail -1)"; }
for r in $(seq $rounds); do
  if (( r % 2 )); then one A $a $r; one B $b $r; else one B $b $r; one A $a $r; fi
done
