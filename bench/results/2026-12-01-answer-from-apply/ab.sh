#!/bin/sh
# The leader's state machine answering its proposals against openraft answering them, at queue
# depth 1: cluster_bench's replication_costs, one round of PAGES pages per run, run ROUNDS times
# with each side in turn (openraft's answer first in odd rounds, the state machine's first in
# even ones), each run a fresh cluster on a fresh process; one line per run in ab.txt.
# Usage (from the repository's root): sh bench/results/2026-12-01-answer-from-apply/ab.sh [ROUNDS] [PAGES]
set -e
cd "$(dirname "$0")/../../.."
out=bench/results/2026-12-01-answer-from-apply
rounds=${1:-8}
pages=${2:-3000}
cargo test --release -p tundra --test cluster_bench --no-run 2>/dev/null
bin=$(ls -t target/release/deps/cluster_bench-* | grep -v '\.d$' | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
run() { # SIDE ROUND HOOK
  env $3 TUNDRA_CLUSTER_BENCH_OUT="$work/$1-$2" TUNDRA_CLUSTER_BENCH_PAGES=$pages TUNDRA_CLUSTER_BENCH_ROUNDS=1 \
    "$bin" replication_costs --nocapture > "$work/$1-$2.log" 2>&1
  # round's line of replication.txt: single_us_p50, replicated_us_p50
  printf '%s\t%s\t%s\n' "$1" "$2" "$(grep -v '^#' "$work/$1-$2/replication.txt" | sed -n 3p | cut -f2,4)"
}
{
  echo "# sh $out/ab.sh $rounds $pages; tundra $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' with uncommitted changes'), release build, $(nproc) CPUs"
  echo "# loadavg before: $(cat /proc/loadavg)"
  echo "# side: state_machine (as built) or openraft (TUNDRA_TEST_ANSWER_BY_OPENRAFT=1); microseconds, medians of the run's writes"
  printf 'side\tround\tsingle_us_p50\treplicated_us_p50\n'
  for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then
      run openraft "$r" TUNDRA_TEST_ANSWER_BY_OPENRAFT=1; run state_machine "$r" TUNDRA_X=0
    else
      run state_machine "$r" TUNDRA_X=0; run openraft "$r" TUNDRA_TEST_ANSWER_BY_OPENRAFT=1
    fi
  done
  echo "# loadavg after: $(cat /proc/loadavg)"
} > $out/ab.txt
python3 - "$out/ab.txt" <<'PY' | tee "$out/ab-summary.txt"
import statistics, sys
rows = [l.split('\t') for l in open(sys.argv[1]) if l[0] != '#' and not l.startswith('side')]
by = {}
for side, rnd, single, repl in rows:
    by.setdefault(rnd, {})[side] = (float(single), float(repl))
ratios = sorted(v['state_machine'][1] / v['openraft'][1] for v in by.values())
sm = sorted(v['state_machine'][1] for v in by.values())
orf = sorted(v['openraft'][1] for v in by.values())
print(f'rounds: {len(ratios)}; replicated write p50, state machine\'s answer: median {statistics.median(sm):.0f} us ({sm[0]:.0f} to {sm[-1]:.0f}); openraft\'s: median {statistics.median(orf):.0f} us ({orf[0]:.0f} to {orf[-1]:.0f})')
print(f'state machine over openraft, per round: median {statistics.median(ratios):.3f} ({ratios[0]:.3f} to {ratios[-1]:.3f}); lower in {sum(r < 1 for r in ratios)} of {len(ratios)} rounds')
PY
