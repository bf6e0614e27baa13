# Sourced by profile.sh and node-stats.sh (from the repository's root): start_workload SYSTEM
# WORKLOAD OUT starts one 20 s full-size PostgreSQL sysbench WORKLOAD on the Tundra stack SYSTEM
# in the background (bench/run's output under OUT), sets $bench to its pid and returns once
# sysbench is running; node_pid SYSTEM prints the pid of that stack's node.
start_workload() {
  bench/run --full --databases postgresql --systems "$1" --workloads "$2" --repetitions 1 --workload-seconds 20 \
    --skip-space --skip-store --skip-drive --skip-extras --out "$3/run" > "$3/run.log" 2>&1 &
  bench=$!
  for _ in $(seq 1 600); do
    pgrep -f "sysbench $2 .* run" > /dev/null && return 0
    sleep 0.5
  done
  echo "sysbench $2 did not start: see $3/run.log" >&2
  return 1
}

node_pid() {
  pgrep -f "tundra serve --data-dir .*postgresql.$1.sysbench" | head -1
}
