#!/bin/bash
# Whether two writes in flight cost less than two in turn on this machine's disk: fio on a
# 256 MiB file written full once, 8 KiB O_DIRECT random writes with an fdatasync after every
# two, one after the other (psync) or both submitted at once (io_uring, depth 2), 5 s each,
# three rounds. Prints write IOPS, mean fdatasync latency and mean write completion latency.
# Usage: bash overlap.sh > overlap.txt
set -euo pipefail
file=$(mktemp /tmp/tundra-overlap.XXXXXX)
trap 'rm -f "$file" "$file.json"' EXIT
dd if=/dev/zero of="$file" bs=1M count=256 oflag=direct status=none
printf 'round\tengine\twrite_iops\tsync_mean_us\twrite_clat_mean_us\n'
for round in 1 2 3; do
  for engine in "psync --iodepth=1" "io_uring --iodepth=2 --iodepth_batch_submit=2 --iodepth_batch_complete_min=2"; do
    fio --name=overlap --filename="$file" --direct=1 --bs=8k --rw=randwrite --size=64m --time_based \
        --runtime=5 --fdatasync=2 --ioengine=$engine --output-format=json > "$file.json"
    python3 - "$file.json" "$round" "${engine%% *}" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
write, sync = job["write"], job["sync"]
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{write['iops']:.0f}\t{sync['lat_ns']['mean'] / 1e3:.0f}\t{write['clat_ns']['mean'] / 1e3:.0f}")
PY
  done
done
