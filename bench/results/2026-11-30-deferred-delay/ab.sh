#!/bin/sh
# Paired rounds FIRST..LAST of two tundra binaries, OLD and NEW: MariaDB's oltp_write_only,
# oltp_update_index and oltp_read_write at full size, one 8 s run each, the builds' order
# alternating by round. Usage: sh ab.sh OLD NEW FIRST LAST [PREFIX]; writes PREFIXold-N/ and
# PREFIXdelay-N/ (run.log, results.json) beside this file.
old=$1; new=$2; first=$3; last=$4; prefix=$5
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
for r in $(seq "$first" "$last"); do
  if [ $((r % 2)) = 1 ]; then order="old delay"; else order="delay old"; fi
  for side in $order; do
    bin=$old; [ "$side" = delay ] && bin=$new
    out=/tmp/tundra-deferred-delay/$prefix$side-$r
    bench/run --full --databases mariadb --systems tundra --workloads oltp_write_only,oltp_update_index,oltp_read_write \
      --repetitions 1 --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$bin" --out "$out" > "$out.log" 2>&1
    mkdir -p "$here/$prefix$side-$r"
    cp "$out.log" "$here/$prefix$side-$r/run.log"
    cp "$out/results.json" "$here/$prefix$side-$r/results.json"
  done
done
