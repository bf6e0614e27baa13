#!/bin/bash
# PostgreSQL 15 on replicated Tundra volumes mounted as files on one node of three (the
# node's [[mount]] of each volume, losetup, ext4), against the same on a node alone:
# pgbench (scale 10, 4 clients, 30 s, progress each second) on each, and on the cluster a
# kill -9 of a node other than the mounting one 10 s into the run, then pg_amcheck, the
# killed node restarted and `tundra cluster status` until it caught up, PostgreSQL stopped
# and e2fsck -n of both filesystems. Usage: bash run.sh [TUNDRA_BIN] > result.txt (needs
# root). Ports 27401 to 27433 and 25433; everything on 127.0.0.1, stopped by PID. LOGS=DIR
# keeps the nodes' logs. ALONE=0 skips the node alone; KILL_AT=N kills node 1 N s into the run
# (10 unless set), KILL_AT=0 before it starts, KILL_AT=none not at all; SAMPLE_CPU=1 prints,
# once a second for 34 s from pgbench's start, the CPU time each node's process used in that
# second (`# cpu TIME n1=.. n2=.. n3=..`, clock ticks of 1/100 s: 100 is one core busy; a node
# restarted under RESTART_AT is followed from its restart, its first second counting all its
# CPU since it started). After
# the restart it says how long the catch-up took and the largest Raft message nodes 2 and 3 sent.
# RESTART_AT=N (with KILL_AT below it) restarts the killed node N s into the run, under load,
# rather than after it: pgbench's progress lines then show what its catch-up costs the writes.
set -euo pipefail
bin=${1:-target/release/tundra}; bin=$(readlink -f "$bin")
pgbin=$(dirname "$(readlink -f "$(command -v initdb 2>/dev/null || ls /usr/lib/postgresql/*/bin/initdb | tail -1)")")
work=$(mktemp -d /tmp/tundra-pgrep.XXXXXX); chmod 1777 "$work"
pids=(); loops=(); mnts=(); pgdata=
logs=${LOGS:-}   # a directory to keep the nodes' logs in
cleanup() {
  [[ -n $logs ]] && mkdir -p "$logs" && cp "$work"/node*.log "$logs"/ 2>/dev/null
  [[ -n $pgdata ]] && runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
  for m in "${mnts[@]}"; do umount "$m" 2>/dev/null || true; done
  for l in "${loops[@]}"; do losetup -d "$l" 2>/dev/null || true; done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  [[ -s $work/restarted.pid ]] && kill "$(cat "$work/restarted.pid")" 2>/dev/null || true
  sleep 2; rm -rf "$work"
}
trap cleanup EXIT
say() { echo "# $*"; }
peers='["1@127.0.0.1:27431", "2@127.0.0.1:27432", "3@127.0.0.1:27433"]'
config() { # ID [cluster]
  cat <<TOML
data_dir = "$work/node$1"
[listen]
native = "127.0.0.1:2740$1"
nbd = "127.0.0.1:2741$1"
metrics = ""
[drive]
physical = "8GiB"
logical = "16GiB"
[fast]
volumes = "512MiB"
TOML
  [[ ${2:-} == cluster ]] && printf '[cluster]\nnode_id = %s\npeers = %s\n' "$1" "$peers"
  return 0
}
mounts() { for v in pgdata pgwal; do printf '[[mount]]\nvolume = "%s"\nfile = "%s"\n%s\n' "$v" "$work/$v.file" "${1:-}"; done; }
start() { # ID
  "$bin" serve --config "$work/node$1.toml" >> "$work/node$1.log" 2>&1 & pid[$1]=$!; pids+=("${pid[$1]}")
  for _ in $(seq 300); do "$bin" volume list --addr "127.0.0.1:2740$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "node $1 did not start"; tail "$work/node$1.log"; exit 1
}
declare -A pid
filesystems() { # mkfs, mount, initdb, start PostgreSQL
  for v in pgdata pgwal; do
    for _ in $(seq 300); do [[ $(stat -c %s "$work/$v.file" 2>/dev/null || echo 0) -gt 0 ]] && break; sleep 0.1; done
    l=$(losetup -f --show --direct-io=on "$work/$v.file"); loops+=("$l")
    mkfs.ext4 -q -F "$l"; mkdir -p "$work/mnt/$v"; mount "$l" "$work/mnt/$v"; mnts+=("$work/mnt/$v")
    chown postgres "$work/mnt/$v"
  done
  pgdata=$work/mnt/pgdata/data
  runuser -u postgres -- "$pgbin/initdb" -D "$pgdata" --waldir "$work/mnt/pgwal/wal" -U postgres -A trust >/dev/null
  printf "port = 25433\nlisten_addresses = ''\nunix_socket_directories = '%s'\nshared_buffers = 32MB\n" "$work" >> "$pgdata/postgresql.conf"
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdata" -l "$work/pg.log" -w start >/dev/null
  runuser -u postgres -- "$pgbin/pgbench" -h "$work" -p 25433 -U postgres -i -s 10 -q postgres 2>&1 | tail -1
}
teardown() {
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$pgdata" -w stop >/dev/null; pgdata=
  for m in "${mnts[@]}"; do umount "$m"; done; mnts=()
  for l in "${loops[@]}"; do e2fsck -fn "$l" 2>&1 | tail -1 | sed 's/^/# e2fsck: /'; losetup -d "$l"; done; loops=()
}
bench() { runuser -u postgres -- "$pgbin/pgbench" -h "$work" -p 25433 -U postgres -c 4 -j 2 -T 30 -P 1 postgres 2>&1 | grep -E "^progress|^tps|^latency|failed"; }

say "tundra $("$bin" --version) ($bin, built from $(git rev-parse --short HEAD 2>/dev/null)); $(nproc) CPUs; $(uname -sr); $("$pgbin/postgres" --version)"
say "load before: $(cut -d' ' -f1-3 /proc/loadavg)"

if [[ ${ALONE:-1} != 0 ]]; then
  say "== a node alone, the volumes created by its [[mount]] sections"
  { config 1; mounts 'size = "2GiB"'; } > "$work/node1.toml"
  start 1; filesystems; bench; teardown
  kill "${pid[1]}"; wait "${pid[1]}" || true; rm -rf "$work/node1" "$work"/*.file
fi

say "== three nodes, both volumes replicated three ways, mounted on node 2"
for i in 1 2 3; do config $i cluster > "$work/node$i.toml"; done
for i in 1 2 3; do start $i; done
for v in pgdata pgwal; do "$bin" volume create $v --size 2GiB --replicas 3 --addr 127.0.0.1:27401 | sed 's/^/# /'; done
kill "${pid[2]}"; wait "${pid[2]}" || true
mounts >> "$work/node2.toml"; start 2
grep "mounted on" "$work/node2.log" | sed 's/^/# /'
filesystems
victim=1
kill_at=${KILL_AT:-10}; killer=; sampler=
if [[ $kill_at == 0 ]]; then kill -9 "${pid[$victim]}"; echo "# killed before"; sleep 2; fi
if [[ $kill_at != none && $kill_at != 0 ]]; then
  ( sleep "$kill_at"; kill -9 "${pid[$victim]}"; echo "# kill -9 of node $victim at $(date +%T.%N | cut -c1-12)" ) & killer=$!
fi
restart_at=${RESTART_AT:-}; restarter=
if [[ -n $restart_at ]]; then
  ( sleep "$restart_at"; start $victim; echo "${pid[$victim]}" > "$work/restarted.pid"
    echo "# node $victim restarted at $(date +%T.%N | cut -c1-12)" ) & restarter=$!
fi
if [[ ${SAMPLE_CPU:-0} == 1 ]]; then
  ( declare -A last; for _ in $(seq 34); do line="$(date +%T)"; for i in 1 2 3; do p=${pid[$i]}; [[ $i == "$victim" && -s $work/restarted.pid ]] && p=$(cat "$work/restarted.pid"); v=$(awk '{print $14+$15}' /proc/$p/stat 2>/dev/null || echo 0); line+=" n$i=$(( v - ${last[$i]:-$v} ))"; last[$i]=$v; done; echo "# cpu $line"; sleep 1; done ) & sampler=$!
fi
bench
if [[ -n $killer ]]; then wait "$killer"; fi
if [[ -n $restarter ]]; then wait "$restarter"; pid[$victim]=$(cat "$work/restarted.pid"); pids+=("${pid[$victim]}"); fi
if [[ -n $sampler ]]; then wait "$sampler"; fi
if runuser -u postgres -- "$pgbin/pg_amcheck" -h "$work" -p 25433 -U postgres --all --install-missing > "$work/amcheck.txt" 2>&1; then
  say "pg_amcheck: clean"
else
  say "pg_amcheck failed:"; sed 's/^/#   /' "$work/amcheck.txt" | head -20
fi
[[ -z $restart_at ]] && start $victim
lag=unknown; waited=$SECONDS
for _ in $(seq 120); do
  lag=$("$bin" cluster status --json --addr 127.0.0.1:27402 | python3 -c '
import json, sys
s = json.load(sys.stdin)
lags = [c.get("lag") for c in s["chunks"]]
print(max(l for l in lags if isinstance(l, int)) if all(n["up"] for n in s["nodes"]) and all(isinstance(l, int) for l in lags) else "-")' || echo "-")
  [[ $lag == 0 ]] && break; sleep 1
done
say "after node $victim's restart: largest chunk lag $lag ($((SECONDS - waited)) s)"
for i in 2 3; do
  say "node $i's largest Raft message sent: $("$bin" cluster status --json --addr 127.0.0.1:2740$i | python3 -c 'import json, sys; print(json.load(sys.stdin)["traffic"]["largest_raft_message_sent"])' || echo -) bytes"
done
say "chunks at the end (volume/chunk: term, leader): $("$bin" cluster status --json --addr 127.0.0.1:27402 | python3 -c '
import json, sys
print(" ".join("%s/%s: t%s n%s" % (c["volume"], c["chunk"], c["term"], c["leader"]) for c in json.load(sys.stdin)["chunks"]))' || echo -)"
teardown
say "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
