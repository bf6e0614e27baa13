#!/bin/sh
# `tundra sim schedule` on arrivals in four eras, each of one dataset (--eras 4), at 1,000 nodes,
# 400 steps (the arrivals over the first 300: the moves these inputs call for take longer than
# the default 200 steps allow), bands of ±10%, ±5%, ±3% and ±1%, seeds 1 to 3; both policies in
# each file. From the repository
# root, with the release build (`cargo build --release -p tundra`).
set -e
cd "$(dirname "$0")/../../.."
d=bench/results/2026-11-29-schedule-eras
cat /proc/loadavg > $d/loadavg-start.txt
for b in 10 5 3 1; do for n in 1 2 3; do
  target/release/tundra sim schedule --json --eras 4 --steps 400 --band $b --seed $n > $d/eras4-band$b-seed$n.json
done; done
target/release/tundra sim schedule --json --points --eras 4 --steps 400 --band 5 --seed 1 > $d/eras4-band5-seed1-points.json
cat /proc/loadavg > $d/loadavg-end.txt
