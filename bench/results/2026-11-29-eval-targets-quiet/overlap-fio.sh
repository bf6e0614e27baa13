#!/bin/sh
# What overlapping a commit's two device writes could save: fio pairs of random 8 KiB O_DIRECT
# writes each followed by fdatasync (fdatasync=2), one write in flight (the store today: the
# page in place, then the log block) against two (both submitted at once), on a file on the
# host disk the node's devices live on; three runs each, alternating.
f=${1:-/tmp/overlap-fio.img}
for run in 1 2 3; do
  for depth in 1 2; do
    fio --name=overlap --filename="$f" --size=256M --ioengine=io_uring --iodepth=$depth --iodepth_batch_submit=$depth \
      --rw=randwrite --bs=8k --direct=1 --fdatasync=2 --runtime=10 --time_based --output-format=terse --terse-version=3 \
      | awk -F';' -v d=$depth -v r=$run '{printf "run %s iodepth %s: %s writes/s, %.0f us per pair of writes and its fdatasync\n", r, d, $49, 2e6/$49}'
  done
done
rm -f "$f"
