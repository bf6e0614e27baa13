#!/bin/bash
# How many of a mount's commits carry their page's image in the fast store's journal (one
# flush) and how many flush the data device first (two): fio's 8 KiB write followed by
# fdatasync, queue depth 1, 8 s, in a 64 MiB region written once before (as ab.sh), with the
# fast journal's counters (`tundra stats`, journals.fast) before and after.
# Usage: bash carried.sh TUNDRA_BIN > carried.txt. Needs root.
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
source "$here/mount.sh"
mount_setup 27991 27992
mount_start "$bin"
before=$("$bin" stats --json --addr 127.0.0.1:27991)
commit_job
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
