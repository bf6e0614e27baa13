#!/bin/bash
# How many of a mount's commits carry their page's image in the fast store's journal (one
# flush) and how many flush the data device first (two): fio's 8 KiB write followed by
# fdatasync, queue depth 1, 8 s, in a 64 MiB region written once before (as ab.sh), with the
# fast journal's counters (`tundra stats`, journals.fast) before and after.
# Usage: bash carried.sh TUNDRA_BIN > carried.txt. Needs root.
set -euo pipefail
bin=$1
work=$(mktemp -d /tmp/tundra-carried.XXXXXX)
pid= ; loop=
trap '[[ -n $loop ]] && losetup -d "$loop"; [[ -n $pid ]] && kill "$pid" && wait "$pid"; rm -rf "$work"' EXIT
cat > "$work/node.toml" <<TOML
data_dir = "$work/data"
[listen]
native = "127.0.0.1:27991"
nbd = "127.0.0.1:27992"
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
before=$("$bin" stats --json --addr 127.0.0.1:27991)
fio --name=commit --filename="$loop" --direct=1 --bs=8k --rw=randwrite --fdatasync=1 --iodepth=1 \
    --size=64m --time_based --runtime=8 --output-format=json > "$work/fio.json"
after=$("$bin" stats --json --addr 127.0.0.1:27991)
python3 - "$work/fio.json" "$before" "$after" <<'PY'
import json, sys
ios = json.load(open(sys.argv[1]))["jobs"][0]["write"]["total_ios"]
a, b = (json.loads(s)["journals"]["fast"] for s in sys.argv[2:4])
d = {k: b[k] - a[k] for k in b}
print(f"fio commits\t{ios}")
for k in sorted(d):
    print(f"fast journal {k}\t{d[k]}")
print(f"group commits that flushed the data device first\t{d['data_flushes'] / d['group_commits']:.2f}")
PY
