#!/bin/sh
# One full-size MariaDB oltp_write_only run (20 s) on one Tundra stack, and the node's
# `tundra stats --json` taken 11 s into it: CPU split between the drive's emulation and the
# host software since the node started (sysbench's prepare included), page latencies, the mix.
# Usage: sh node-stats.sh SYSTEM; writes node-stats/SYSTEM.json and SYSTEM.tps.txt.
set -e
sys=$1; here=$(cd "$(dirname "$0")" && pwd); out=/tmp/tundra-node-stats-$sys
cd "$here/../../.."
rm -rf "$out"; mkdir -p "$out" "$here/node-stats"
bench/run --full --databases mariadb --systems "$sys" --workloads oltp_write_only --repetitions 1 --workload-seconds 20 \
  --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/run.log" 2>&1 &
run=$!
for _ in $(seq 1 600); do pgrep -f "sysbench oltp_write_only .* run" > /dev/null && break; sleep 0.5; done
sleep 11
node=$(pgrep -f "tundra serve .*mariadb.$sys.sysbench" | head -1)
conf=$(tr '\0' ' ' < /proc/$node/cmdline | sed 's/.*--config \([^ ]*\).*/\1/')
addr=$(grep -m1 -E '^ *native *=' "$conf" | sed 's/.*"\(.*\)".*/\1/')
target/release/tundra stats --json --addr "$addr" > "$here/node-stats/$sys.json"
wait $run
grep tps "$out/run.log" > "$here/node-stats/$sys.tps.txt"
