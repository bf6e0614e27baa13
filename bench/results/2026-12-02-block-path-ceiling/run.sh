#!/bin/sh
# How close Tundra with compression off is to the block path's own ceiling on this kernel:
# ext4 on a loop file, `fuse-null` (tundra-off's FUSE export and loop device with plain host
# files behind them instead of the store) and tundra-off, on the single-statement write
# workloads, three repetitions each, in one run. Regenerates this directory's results.json,
# report.md and logs/; `python3 summarize.py` prints summary.txt.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
cargo build --release -p tundra
bench/run --full --databases postgresql,mariadb --systems ext4,fuse-null,tundra-off \
  --workloads oltp_write_only,oltp_update_index,oltp_update_non_index,oltp_insert --repetitions 3 \
  --skip-space --skip-store --skip-drive --skip-extras --out "$here"
python3 "$here/summarize.py" > "$here/summary.txt"
