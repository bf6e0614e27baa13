#!/bin/bash
# Reads of many pages through the mounted volume file, two builds alternating: one.sh for each
# build in turn, ROUNDS rounds (the first build first in odd rounds), then the medians.
# Usage (root, from anywhere): ab.sh BIN_BEFORE BIN_AFTER ROUNDS > ab.txt
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
before=$1; after=$2; rounds=$3
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
echo "# ab.sh BEFORE AFTER $rounds; $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); loadavg before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# one.sh: tundra serve, compression off in both layers, one 1 GiB volume of 8 KiB pages mounted as a file; 256 MiB written to it sequentially (dd, 1 MiB direct writes); then fio, 6 s each, psync, direct, on the file itself (no loop device, no ext4), and random 64 KiB reads again after 8 s of random 8 KiB rewrites; device reads of the node (pread64 calls and io_uring reads) per fio I/O from perf stat"
printf 'round\tbuild\tjob\tiops\tpreads_per_io\n'
for r in $(seq "$rounds"); do
  if (( r % 2 )); then order="before after"; else order="after before"; fi
  for side in $order; do
    bin=$before; [ "$side" = after ] && bin=$after
    "$here/one.sh" "$bin" "$work/$side-$r" | while read -r rw bs iops per; do
      printf '%s\t%s\t%s %s\t%s\t%s\n' "$r" "$side" "$rw" "$bs" "${iops#iops=}" "${per#preads_per_io=}"
    done
  done
done
echo "# loadavg after: $(cut -d' ' -f1-3 /proc/loadavg)"
