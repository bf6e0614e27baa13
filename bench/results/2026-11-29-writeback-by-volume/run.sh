#!/bin/sh
# The write-back cache kept by volume (a WAL commit's flush visits the WAL volume's pages only)
# against the build before it: full-size sysbench write workloads on Tundra with compression
# off, three repetitions, the two builds alternating: PostgreSQL over two rounds, MariaDB over
# one. Usage: sh run.sh BEFORE_BIN AFTER_BIN; then python3 summarize.py.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
before=$1; after=$2
one() { # DATABASE BIN OUT
  bench/run --full --databases "$1" --systems tundra-off \
    --workloads oltp_write_only,oltp_update_index,oltp_update_non_index,oltp_insert --repetitions 3 \
    --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$2" --out "$here/$3"
}
for round in 1 2; do
  one postgresql "$after" "after-$round"
  one postgresql "$before" "before-$round"
done
one mariadb "$after" mariadb-after-1
one mariadb "$before" mariadb-before-1
