#!/bin/bash
# One commit's cost through a mount, for two builds in alternation: fio's 8 KiB write followed
# by fdatasync, queue depth 1, 8 s, in a 64 MiB region written once before, on a loop device
# over `tundra mount` of an uncompressed (mode none) volume on a fresh node (breakdown.sh's
# loop-tundra layer of 2026-11-29-commit-path). Prints per round and build: IOPS, µs per write
# and fdatasync, and the node's mean flush of the volume (µs, `tundra stats`).
# Usage: bash ab.sh BIN_A BIN_B [ROUNDS] > ab.txt (ROUNDS defaults to 5). Needs root.
set -euo pipefail
rounds=${3:-5}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/mount.sh"
mount_setup 27971 27972
flush_of() { # STATS_JSON -> "count mean_us" of the volume's flushes
  python3 -c 'import json, sys; v = next(v for v in json.loads(sys.argv[1])["volumes"] if v["name"] == "commit")["flush"]; print(v["count"], v["mean_us"])' "$1"
}
printf 'round\tbuild\tiops\tus_per_commit\tnode_flush_mean_us\n'
for round in $(seq "$rounds"); do
  for which in A B; do
    bin=$1; [[ $which == B ]] && bin=$2
    mount_start "$bin"
    before=$(flush_of "$("$bin" stats --json --addr 127.0.0.1:27971)")
    commit_job
    after=$(flush_of "$("$bin" stats --json --addr 127.0.0.1:27971)")
    python3 - "$work/fio.json" "$round" "$which" "$before" "$after" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
(n0, m0), (n1, m1) = (map(float, s.split()) for s in sys.argv[4:6])
flush = (m1 * n1 - m0 * n0) / (n1 - n0)
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{w['iops']:.0f}\t{1e6 / w['iops']:.0f}\t{flush:.0f}")
PY
    mount_stop
  done
done
