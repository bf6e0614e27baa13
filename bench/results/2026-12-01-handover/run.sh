#!/bin/bash
# The leader balancer's campaigns with a handover (the leader holds the chunk's writes until the
# taker holds its whole log) against campaigns without one (TUNDRA_TEST_NO_HANDOVER=1 in the
# nodes' environment), on PostgreSQL with a follower restarted under load:
# `ALONE=0 KILL_AT=5 RESTART_AT=15 SAMPLE_CPU=1 ../2026-11-30-pg-replicated-mount/run.sh`, ROUNDS
# times each way, alternating (without first in odd rounds); run-SIDE-N.txt per run and the
# nodes' logs in logs-SIDE-N/. Usage (root, from the repository's root; about 2 minutes a run):
#   bash bench/results/2026-12-01-handover/run.sh [ROUNDS] [TUNDRA_BIN]
set -euo pipefail
here=$(dirname "$(readlink -f "$0")")
rounds=${1:-3}
bin=$(readlink -f "${2:-target/release/tundra}")
one() { # SIDE N
  rm -rf "$here/logs-$1-$2"
  local hook=TUNDRA_X=0; [[ $1 == without ]] && hook=TUNDRA_TEST_NO_HANDOVER=1
  env "$hook" ALONE=0 KILL_AT=5 RESTART_AT=15 SAMPLE_CPU=1 LOGS="$here/logs-$1-$2" \
    bash "$here/../2026-11-30-pg-replicated-mount/run.sh" "$bin" > "$here/run-$1-$2.txt" 2>&1
}
for n in $(seq 1 "$rounds"); do
  if (( n % 2 )); then one without "$n"; one with "$n"; else one with "$n"; one without "$n"; fi
done
