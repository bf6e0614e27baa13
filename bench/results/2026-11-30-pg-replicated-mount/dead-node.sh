#!/bin/bash
# The replicated half of run.sh with node 1 killed before pgbench starts (two nodes up for the
# whole run) and each node's CPU sampled once a second: run.sh with ALONE=0 SAMPLE_CPU=1 and
# KILL_AT=0 unless KILL_AT is set (KILL_AT=none kills no node). Usage: bash dead-node.sh
# [TUNDRA_BIN] > dead-node-N.txt (root; about 3 minutes).
export ALONE=0 SAMPLE_CPU=1 KILL_AT=${KILL_AT:-0}
exec bash "$(dirname "$(readlink -f "$0")")/run.sh" "$@"
