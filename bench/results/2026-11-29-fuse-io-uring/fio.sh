#!/bin/bash
# The two transports alone, with no database and no filesystem: fio on a loop device
# (direct I/O) over a `tundra mount` of an uncompressed (mode none) 1 GiB volume, the kernel's
# enable_uring switched between runs of the same build, three rounds alternating. Jobs, 8 s
# each: 8 KiB writes each followed by fdatasync at queue depth 1 (a commit), 8 KiB random
# reads at queue depth 1 and at 16 (libaio). Prints one line per job: round, transport, job,
# IOPS, mean latency in µs. Usage: bash fio.sh TUNDRA_BIN > fio.txt. Needs root.
# With a second build, `bash fio.sh BIN_A BIN_B` compares the two builds instead, both over
# io_uring (the transport column then names the build: a or b).
set -euo pipefail
bin=$1
other=${2:-}
uring=/sys/module/fuse/parameters/enable_uring
work=$(mktemp -d /tmp/tundra-fio.XXXXXX)
node_pid=
loop=
cleanup() {
  [[ -n $loop ]] && losetup -d "$loop" 2>/dev/null || true
  [[ -n $node_pid ]] && kill "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null || true
  echo Y > "$uring"
  rm -rf "$work"
}
trap cleanup EXIT
cat > "$work/node.toml" <<TOML
data_dir = "$work/data"
[listen]
native = "127.0.0.1:27931"
nbd = "127.0.0.1:27932"
metrics = ""
[drive]
physical = "2GiB"
logical = "4GiB"
[fast]
volumes = "1536MiB"
TOML
job() { # ROUND TRANSPORT NAME FIO-ARGS...
  local round=$1 transport=$2 name=$3; shift 3
  fio --name="$name" --filename="$loop" --direct=1 --bs=8k --time_based --runtime=8 --size=1g \
      --output-format=json "$@" > "$work/$name.json"
  python3 - "$work/$name.json" "$round" "$transport" "$name" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))["jobs"][0]
side = job["write"] if job["write"]["io_bytes"] else job["read"]
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{side['iops']:.0f}\t{side['lat_ns']['mean'] / 1000:.1f}")
PY
}
printf 'round\ttransport\tjob\tiops\tmean_latency_us\n'
for round in 1 2 3; do
  for setting in Y N; do
    run_bin=$bin
    if [[ -n $other ]]; then
      transport=$([[ $setting == Y ]] && echo a || echo b)
      [[ $setting == N ]] && run_bin=$other
      setting=Y
    else
      transport=$([[ $setting == Y ]] && echo io_uring || echo /dev/fuse)
    fi
    echo "$setting" > "$uring"
    rm -rf "$work/data" "$work/vol"
    "$run_bin" mount fio "$work/vol" --config "$work/node.toml" --size 1GiB --mode none > "$work/node.log" 2>&1 &
    node_pid=$!
    for _ in $(seq 100); do [[ $(stat -c %s "$work/vol" 2>/dev/null || echo 0) -gt 0 ]] && break; sleep 0.2; done
    grep -q "mounted on .*$( [[ $setting == Y ]] && echo 'io_uring' || echo '/dev/fuse')" "$work/node.log" \
      || { echo "the mount did not use $transport:" >&2; cat "$work/node.log" >&2; exit 1; }
    loop=$(losetup -f --show --direct-io=on "$work/vol")
    job "$round" "$transport" write-fdatasync-qd1 --rw=randwrite --fdatasync=1 --iodepth=1
    job "$round" "$transport" randread-qd1 --rw=randread --iodepth=1
    job "$round" "$transport" randread-qd16 --rw=randread --iodepth=16 --ioengine=libaio
    losetup -d "$loop"; loop=
    kill "$node_pid"; wait "$node_pid" || true; node_pid=
  done
done
