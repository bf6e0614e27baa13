#!/bin/sh
# MariaDB's oltp_write_only, full size, one 8 s run of Tundra and of Tundra with compression off
# per round, six rounds (Tundra first in rounds 1-3, second in 4-6), with `vmstat 1 7` started
# one second into each run. Usage: sh cpu.sh; writes cpu/SYSTEM-ROUND.log and .vmstat.txt.
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
mkdir -p "$here/cpu"
one() {
  bench/run --full --databases mariadb --systems "$1" --workloads oltp_write_only --repetitions 1 \
    --skip-space --skip-store --skip-drive --skip-extras --out "/tmp/tundra-cpu/$1-$2" > "$here/cpu/$1-$2.log" 2>&1 &
  run=$!
  for _ in $(seq 1 600); do pgrep -f "sysbench oltp_write_only .* run" > /dev/null && break; sleep 0.5; done
  sleep 1
  vmstat 1 7 > "$here/cpu/$1-$2.vmstat.txt"
  wait $run
}
for round in 1 2 3; do one tundra $round; one tundra-off $round; done
for round in 4 5 6; do one tundra-off $round; one tundra $round; done
