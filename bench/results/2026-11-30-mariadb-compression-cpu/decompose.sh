#!/bin/sh
# MariaDB's oltp_write_only and oltp_update_index, full size, one 8 s run per system per round,
# three rounds, the systems' order rotating by one each round: Tundra with compression off, both
# layers, each layer alone, and both layers with the drive compressing in the writer's thread.
# Usage: sh decompose.sh; writes decompose/rROUND-SYSTEM.log beside this file.
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
mkdir -p "$here/decompose"
set -- tundra-off tundra tundra-software-only tundra-drive-only tundra-drive-inline
for round in 1 2 3; do
  for sys in "$@"; do
    bench/run --full --databases mariadb --systems "$sys" --workloads oltp_write_only,oltp_update_index \
      --repetitions 1 --skip-space --skip-store --skip-drive --skip-extras --out "/tmp/tundra-decompose/r$round-$sys" \
      > "$here/decompose/r$round-$sys.log" 2>&1
  done
  first=$1; shift; set -- "$@" "$first"
done
