#!/bin/bash
# usage: ab.sh ROUNDS WORKLOADS OUT: alternates the old and new binary under bench/run (mariadb, tundra-off), once each per round
cd /work/main
rounds=$1; w=$2; out=$3; mkdir -p $out
for r in $(seq 1 $rounds); do
  for b in old new; do
    cp /tmp/tundra-$b target/release/tundra
    rm -rf $out/$b-$r
    bench/run --quick --databases mariadb --systems tundra-off --workloads $w --repetitions 1 --skip-space --skip-store --skip-drive --out $out/$b-$r > $out/$b-$r.log 2>&1
    grep -h "tps" $out/$b-$r.log | sed "s/^/$b $r /"
  done
done
cp /tmp/tundra-new target/release/tundra
