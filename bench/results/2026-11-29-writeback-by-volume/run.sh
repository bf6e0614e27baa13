#!/bin/sh
# The write-back cache kept by volume (a WAL commit's flush visits the WAL volume's pages only)
# against the build before it: full-size PostgreSQL sysbench write workloads on Tundra with
# compression off, three repetitions, the two builds alternating over two rounds.
# Usage: sh run.sh BEFORE_BIN AFTER_BIN; then python3 summarize.py.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
before=$1; after=$2
for round in 1 2; do
  for b in after before; do
    eval bin=\$$b
    bench/run --full --databases postgresql --systems tundra-off \
      --workloads oltp_write_only,oltp_update_index,oltp_update_non_index,oltp_insert --repetitions 3 \
      --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$bin" --out "$here/$b-$round"
  done
done
