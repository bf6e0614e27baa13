#!/bin/bash
# Where a commit's time goes on the block path: fio's 8 KiB write followed by fdatasync, queue
# depth 1, 8 s, in a 64 MiB region written once before (a sequential pass and an fsync, so
# that no layer pays for first allocating its blocks in the host filesystem, as a database's
# recycled WAL does not), on each layer of the path in turn, three rounds:
#   host-file      a sparse host file opened with O_DIRECT (what a host filesystem's commit pays)
#   loop-host      a loop device (direct I/O) over such a file (ext4 on a loop file's device)
#   loop-null-mem  a loop device over the in-process FUSE export with memory behind it
#                  (`tundra bench null-export --memory`): the loop device and FUSE alone
#   loop-null-file the same export with a host file behind it (`fuse-null` of bench/run)
#   loop-tundra    a loop device over `tundra mount` of an uncompressed (mode none) volume,
#                  with the node's own time per flush of the volume (`tundra stats`)
# Prints: round, layer, IOPS, µs per write and fdatasync, the node's mean flush (µs).
# Usage: bash breakdown.sh TUNDRA_BIN > breakdown.txt. Needs root.
set -euo pipefail
bin=$1
work=$(mktemp -d /tmp/tundra-commit.XXXXXX)
pid= ; loop=
stop() {
  [[ -n $loop ]] && losetup -d "$loop" 2>/dev/null || true; loop=
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; pid=
}
trap 'stop; rm -rf "$work"' EXIT
cat > "$work/node.toml" <<TOML
data_dir = "$work/data"
[listen]
native = "127.0.0.1:27941"
nbd = "127.0.0.1:27942"
metrics = ""
[drive]
physical = "2GiB"
logical = "4GiB"
[fast]
volumes = "1536MiB"
TOML
wait_size() { for _ in $(seq 150); do [[ $(stat -c %s "$1" 2>/dev/null || echo 0) -gt 0 ]] && return; sleep 0.2; done; echo "no mount on $1" >&2; exit 1; }
warm() { fio --name=warm --filename="$1" --direct=1 --bs=1m --rw=write --size=64m --end_fsync=1 >/dev/null; }
run_fio() { # ROUND LAYER TARGET [NODE_FLUSH_US]
  fio --name=commit --filename="$3" --direct=1 --bs=8k --rw=randwrite --fdatasync=1 --iodepth=1 \
      --size=64m --time_based --runtime=8 --output-format=json > "$work/fio.json"
  python3 - "$work/fio.json" "$1" "$2" "${4:-}" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["jobs"][0]["write"]
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{w['iops']:.0f}\t{1e6 / w['iops']:.0f}\t{sys.argv[4] or '-'}")
PY
}
printf 'round\tlayer\tiops\tus_per_commit\tnode_flush_mean_us\n'
for round in 1 2 3; do
  rm -rf "$work"/{host.img,null.img,vol,null,data}
  truncate -s 1G "$work/host.img"
  warm "$work/host.img"; run_fio "$round" host-file "$work/host.img"
  loop=$(losetup -f --show --direct-io=on "$work/host.img")
  warm "$loop"; run_fio "$round" loop-host "$loop"; stop
  "$bin" bench null-export --file "$work/null" --size 1GiB --memory > "$work/null.log" 2>&1 & pid=$!
  wait_size "$work/null"; loop=$(losetup -f --show --direct-io=on "$work/null")
  warm "$loop"; run_fio "$round" loop-null-mem "$loop"; stop
  truncate -s 0 "$work/null.img"
  "$bin" bench null-export --file "$work/null" --size 1GiB --backing "$work/null.img" > "$work/null.log" 2>&1 & pid=$!
  wait_size "$work/null"; loop=$(losetup -f --show --direct-io=on "$work/null")
  warm "$loop"; run_fio "$round" loop-null-file "$loop"; stop
  "$bin" mount commit "$work/vol" --config "$work/node.toml" --size 1GiB --mode none > "$work/node.log" 2>&1 & pid=$!
  wait_size "$work/vol"; loop=$(losetup -f --show --direct-io=on "$work/vol")
  warm "$loop"
  before=$("$bin" stats --json --addr 127.0.0.1:27941)
  run_fio "$round" loop-tundra "$loop" placeholder > "$work/line"
  after=$("$bin" stats --json --addr 127.0.0.1:27941)
  flush=$(python3 - "$before" "$after" <<'PY'
import json, sys
def flush(text):
    v = next(v for v in json.loads(text)["volumes"] if v["name"] == "commit")
    return v["flush"]
a, b = flush(sys.argv[1]), flush(sys.argv[2])
n = b["count"] - a["count"]
print(f"{(b['mean_us'] * b['count'] - a['mean_us'] * a['count']) / n:.0f}" if n else "-")
PY
)
  sed "s/placeholder/$flush/" "$work/line"
  stop
done
