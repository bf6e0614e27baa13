#!/bin/bash
# Usage: one.sh BIN OUT — a tundra-off node with one mounted volume; 256 MiB written sequentially
# through the FUSE file; fio random 64 KiB and sequential 128 KiB direct reads on it, then random
# 64 KiB reads again after 8 s of random 8 KiB rewrites; the node's device reads counted (pread64
# calls and io_uring reads, IORING_OP_READ = 22).
set -euo pipefail
bin=$1; out=$2; rm -rf "$out"; mkdir -p "$out/files"
cat > "$out/tundra.toml" <<T
[listen]
native = "127.0.0.1:29561"
nbd = "127.0.0.1:29560"
metrics = "127.0.0.1:29562"
[drive]
physical = "4294967296"
compression = "off"
[fast]
volumes = "1073741824"
[compression]
software = "off"
[[mount]]
volume = "data"
file = "$out/files/data"
size = "1073741824"
page_size = "8KiB"
mode = "normal"
T
"$bin" serve --data-dir "$out/data" --config "$out/tundra.toml" > "$out/serve.log" 2>&1 &
pid=$!
for i in $(seq 100); do [ -e "$out/files/data" ] && [ "$(stat -c %s "$out/files/data" 2>/dev/null)" = 1073741824 ] && break; sleep 0.2; done
sleep 1
dd if=/dev/urandom of="$out/files/data" bs=1M count=256 oflag=direct conv=notrunc status=none
sync "$out/files/data"
for job in "randread 64k" "read 128k" "randread 8k"; do
  set -- $job
  perf stat -e 'syscalls:sys_enter_pread64' -e 'io_uring:io_uring_submit_req' --filter 'opcode == 22' -p $pid -o "$out/perf-$1-$2.txt" -- \
    fio --name=$1-$2 --filename="$out/files/data" --size=256M --bs=$2 --rw=$1 --ioengine=psync --direct=1 \
      --time_based --runtime=6 --output-format=json > "$out/fio-$1-$2.json" 2>/dev/null
  iops=$(python3 -c "import json;print(round(json.load(open('$out/fio-$1-$2.json'))['jobs'][0]['read']['iops']))")
  preads=$(grep -E 'pread64|io_uring_submit_req' "$out/perf-$1-$2.txt" | awk '{gsub(",","",$1); n+=$1} END{print n}')
  ios=$(python3 -c "import json;print(json.load(open('$out/fio-$1-$2.json'))['jobs'][0]['read']['total_ios'])")
  echo "$1 $2 iops=$iops preads_per_io=$(python3 -c "print(round($preads/$ios,2))")"
done
# The same pages rewritten one at a time (random 8 KiB direct writes for 8 s, then a flush):
# neighbouring pages no longer lie in neighbouring runs.
fio --name=rewrite --filename="$out/files/data" --size=256M --bs=8k --rw=randwrite --ioengine=psync --direct=1 \
  --time_based --runtime=8 --output-format=json > "$out/fio-rewrite.json" 2>/dev/null
sync "$out/files/data"
perf stat -e 'syscalls:sys_enter_pread64' -e 'io_uring:io_uring_submit_req' --filter 'opcode == 22' -p $pid -o "$out/perf-rewritten.txt" -- \
  fio --name=rewritten --filename="$out/files/data" --size=256M --bs=64k --rw=randread --ioengine=psync --direct=1 \
    --time_based --runtime=6 --output-format=json > "$out/fio-rewritten.json" 2>/dev/null
iops=$(python3 -c "import json;print(round(json.load(open('$out/fio-rewritten.json'))['jobs'][0]['read']['iops']))")
preads=$(grep -E 'pread64|io_uring_submit_req' "$out/perf-rewritten.txt" | awk '{gsub(",","",$1); n+=$1} END{print n}')
ios=$(python3 -c "import json;print(json.load(open('$out/fio-rewritten.json'))['jobs'][0]['read']['total_ios'])")
echo "randread-rewritten 64k iops=$iops preads_per_io=$(python3 -c "print(round($preads/$ios,2))")"
kill $pid; wait $pid || true
