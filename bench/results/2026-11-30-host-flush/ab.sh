#!/bin/sh
# The host's flush without the collector's head, against the build before it: ROUNDS rounds
# (default 3), each running both builds one after the other (their order alternating) on
# PostgreSQL's and MariaDB's four write workloads, Tundra with both compression layers, full
# size, one repetition per round. Usage: sh ab.sh OLD_BIN NEW_BIN [ROUNDS [FIRST [DATABASES]]]
# (rounds FIRST.., default 1; databases default postgresql,mariadb); raw results in old-N/ and
# new-N/ beside this file, summarize.py prints the paired ratios.
set -e
old=$1; new=$2; rounds=${3:-3}; first=${4:-1}; databases=${5:-postgresql,mariadb}
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
run() {
  bench/run --full --databases "$databases" --systems tundra \
    --workloads oltp_write_only,oltp_update_index,oltp_update_non_index,oltp_insert --repetitions 1 \
    --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$2" --out "$here/$1" > "$here/$1.log" 2>&1
}
for r in $(seq "$first" $((first + rounds - 1))); do
  if [ $((r % 2)) -eq 1 ]; then run "old-$r" "$old"; run "new-$r" "$new"
  else run "new-$r" "$new"; run "old-$r" "$old"; fi
  echo "round $r done"
done
