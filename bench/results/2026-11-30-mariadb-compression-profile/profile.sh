#!/bin/sh
# Profiles the whole machine during one full-size MariaDB sysbench workload on one Tundra stack:
# perf record -a -g for 8 s, 3 s into a 20 s run. Usage: sh profile.sh [SYSTEM] [WORKLOAD]
# (defaults tundra, oltp_write_only); writes profile-<system>-<workload>.txt beside this file:
# the run's tps, the samples by command, the node's samples by thread and by symbol.
set -e
sys=${1:-tundra}; wl=${2:-oltp_write_only}; out=/tmp/tundra-profile-$sys-$wl
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
rm -rf "$out"; mkdir -p "$out"
bench/run --full --databases mariadb --systems "$sys" --workloads "$wl" --repetitions 1 --workload-seconds 20 \
  --skip-space --skip-store --skip-drive --skip-extras --out "$out/run" > "$out/run.log" 2>&1 &
bench=$!
started=
for _ in $(seq 1 600); do
  if pgrep -f "sysbench $wl .* run" > /dev/null; then started=1; break; fi
  sleep 0.5
done
[ -n "$started" ] || { echo "sysbench $wl did not start: see $out/run.log" >&2; exit 1; }
sleep 3
node=$(pgrep -f "tundra serve --data-dir .*mariadb.$sys.sysbench" | head -1)
perf record -a -g -F 499 -o "$out/all.data" -- sleep 8 > /dev/null 2>&1
wait $bench
{
  echo "# sh profile.sh $sys $wl ($(date -u +%FT%TZ), $(git rev-parse --short HEAD))"
  grep "tps" "$out/run.log"
  echo "# perf report --no-children --sort comm"
  perf report -i "$out/all.data" --no-children --sort comm --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -25
  echo "# the node's samples by thread"
  perf report -i "$out/all.data" --no-children --pid "$node" --sort tid --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -20
  echo "# the node's samples by symbol"
  perf report -i "$out/all.data" --no-children --pid "$node" --sort sym --stdio -g none 2>/dev/null | grep -v "^#" | grep -v "^$" | head -40
} > "$here/profile-$sys-$wl.txt"
cat "$here/profile-$sys-$wl.txt"
