# Sourced by ab.sh and carried.sh: a fresh node with a mode none volume of 1 GiB mounted as
# $work/vol and a loop device over it, written once (64 MiB), for fio's commit job.
# Set up by `mount_setup NATIVE_PORT NBD_PORT`; `mount_start BIN` starts a fresh node and sets
# $pid and $loop; `mount_stop` stops both; `commit_job` runs the fio job into $work/fio.json.
mount_setup() {
  work=$(mktemp -d /tmp/tundra-commit.XXXXXX)
  pid= ; loop=
  trap 'mount_stop; rm -rf "$work"' EXIT
  cat > "$work/node.toml" <<TOML
data_dir = "$work/data"
[listen]
native = "127.0.0.1:$1"
nbd = "127.0.0.1:$2"
metrics = ""
[drive]
physical = "2GiB"
logical = "4GiB"
[fast]
volumes = "1536MiB"
TOML
}
mount_start() {
  rm -rf "$work/data" "$work/vol"
  "$1" mount commit "$work/vol" --config "$work/node.toml" --size 1GiB --mode none > "$work/node.log" 2>&1 & pid=$!
  for _ in $(seq 150); do [[ $(stat -c %s "$work/vol" 2>/dev/null || echo 0) -gt 0 ]] && break; sleep 0.2; done
  loop=$(losetup -f --show --direct-io=on "$work/vol")
  fio --name=warm --filename="$loop" --direct=1 --bs=1m --rw=write --size=64m --end_fsync=1 >/dev/null
}
mount_stop() {
  [[ -n $loop ]] && losetup -d "$loop" 2>/dev/null || true; loop=
  [[ -n $pid ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true; pid=
}
commit_job() {
  fio --name=commit --filename="$loop" --direct=1 --bs=8k --rw=randwrite --fdatasync=1 --iodepth=1 \
      --size=64m --time_based --runtime=8 --output-format=json > "$work/fio.json"
}
