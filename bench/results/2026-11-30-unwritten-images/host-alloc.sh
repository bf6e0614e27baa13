#!/bin/bash
# What a commit into never-written host blocks costs: fio's 8 KiB random write followed by
# fdatasync, queue depth 1, 5 s, O_DIRECT, over a 1 GiB host file that is sparse, allocated
# with fallocate (unwritten extents), or written once with zeros; three rounds.
# Usage: bash host-alloc.sh [DIR] > host-alloc.txt (DIR: where the file goes, default /tmp).
set -euo pipefail
file=$(mktemp "${1:-/tmp}/tundra-host-alloc.XXXXXX")
trap 'rm -f "$file"' EXIT
printf 'round\tfile\tiops\tus_per_commit\n'
for round in 1 2 3; do
  for mode in sparse fallocated written; do
    rm -f "$file"; truncate -s 1G "$file"
    [[ $mode == fallocated ]] && fallocate -l 1G "$file"
    [[ $mode == written ]] && dd if=/dev/zero of="$file" bs=1M count=1024 oflag=direct conv=notrunc status=none
    fio --name=c --filename="$file" --direct=1 --bs=8k --rw=randwrite --fdatasync=1 --iodepth=1 \
        --size=1g --time_based --runtime=5 --output-format=json 2>/dev/null \
      | python3 -c "import json, sys; w = json.load(sys.stdin)['jobs'][0]['write']; print(f\"$round\t$mode\t{w['iops']:.0f}\t{1e6 / w['iops']:.0f}\")"
  done
done
