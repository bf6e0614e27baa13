#!/bin/sh
# FUSE over io_uring against /dev/fuse for Tundra's mounts: the same build, the kernel's
# enable_uring switched between runs (a mount uses io_uring only where the kernel offers it),
# PostgreSQL and MariaDB, ext4 on a loop file and Tundra with compression off, the seven
# sysbench workloads, quick size, three repetitions, two rounds with the settings alternating.
# Usage: sh run.sh TUNDRA_BIN; then python3 summarize.py. Needs root.
set -e
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../../.."
bin=$1
uring=/sys/module/fuse/parameters/enable_uring
one() { # Y|N OUT
  echo "$1" > "$uring"
  TUNDRA_KEEP_FUSE_URING=1 bench/run --quick --databases postgresql,mariadb --systems ext4,tundra-off \
    --repetitions 3 --skip-space --skip-store --skip-drive --skip-extras --tundra-bin "$bin" --out "$here/$2"
}
for round in 1 2; do
  one Y "uring-$round"
  one N "devfuse-$round"
done
echo Y > "$uring"
