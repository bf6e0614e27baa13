#!/bin/bash
# The node's system calls while fio commits through a mount (as breakdown.sh's loop-tundra:
# a 64 MiB region written once, then 8 KiB writes each followed by fdatasync at queue depth 1):
# `perf trace -s` of the node for 3 s in the middle of the 8 s run, then the totals per call,
# and how much of the host file under the node's fast device the run allocated anew.
# Usage: bash node-syscalls.sh TUNDRA_BIN > node-syscalls.txt (perf's own summary is kept in
# node-syscalls-perf.txt). Needs root and perf.
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/tundra-syscalls.XXXXXX)
pid= ; loop=
trap '[[ -n $loop ]] && losetup -d "$loop"; [[ -n $pid ]] && kill "$pid" && wait "$pid"; rm -rf "$work"' EXIT
cat > "$work/node.toml" <<TOML
data_dir = "$work/data"
[listen]
native = "127.0.0.1:27951"
nbd = "127.0.0.1:27952"
metrics = ""
[drive]
physical = "2GiB"
logical = "4GiB"
[fast]
volumes = "1536MiB"
TOML
"$bin" mount commit "$work/vol" --config "$work/node.toml" --size 1GiB --mode none > "$work/node.log" 2>&1 & pid=$!
for _ in $(seq 150); do [[ $(stat -c %s "$work/vol" 2>/dev/null || echo 0) -gt 0 ]] && break; sleep 0.2; done
loop=$(losetup -f --show --direct-io=on "$work/vol")
fio --name=warm --filename="$loop" --direct=1 --bs=1m --rw=write --size=64m --end_fsync=1 >/dev/null
sleep 1
before=$(stat -c %b "$work/data/fast.img")
fio --name=commit --filename="$loop" --direct=1 --bs=8k --rw=randwrite --fdatasync=1 --iodepth=1 \
    --size=64m --time_based --runtime=8 --output-format=json > "$work/fio.json" &
sleep 2
timeout -s INT 3 perf trace -s -p "$pid" -o "$here/node-syscalls-perf.txt" 2>/dev/null || true
wait %2
after=$(stat -c %b "$work/data/fast.img")
python3 - "$work/fio.json" "$before" "$after" <<'PY'
import json, sys
ios = json.load(open(sys.argv[1]))["jobs"][0]["write"]["total_ios"]
grown = (int(sys.argv[3]) - int(sys.argv[2])) * 512
print(f"fio commits\t{ios}\nfast.img allocated anew\t{grown // 1024} KiB ({grown / 4096 / ios:.2f} host blocks per commit)")
PY
grep -E "^ +(pwrite64|pread64|fdatasync|fsync|io_uring_enter|futex) " "$here/node-syscalls-perf.txt" \
  | awk '{n[$1]+=$2; t[$1]+=$4} END {for (k in n) printf "%s\t%d calls\t%.1f ms\t%.1f us each\n", k, n[k], t[k], 1000*t[k]/n[k]}' \
  | sort
