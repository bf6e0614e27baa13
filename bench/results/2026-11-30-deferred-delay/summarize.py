#!/usr/bin/env python3
"""Prints summary.txt from the runs beside this file: per pair of runs (the build of 28564bf,
`old-N`, against the build with the delay, `delay-N`; the second series `copies-old-N` against
`copies-delay-N`, the delay with in-memory copies), each workload's tps ratio, their geometric
mean, and per run the node's CPU per transaction over the three workloads (the difference of
`tundra stats` after the updates and after the load, so sysbench's prepare and its drain are
left out) with the drive's deflates."""
import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ["oltp_write_only", "oltp_update_index", "oltp_read_write"]


def run(name):
    entry = json.loads((HERE / name / "results.json").read_text())["throughput"][0]
    before = entry["after_load"]["details"]["cpu"]
    after = entry["after_updates"]["details"]["cpu"]
    tps = {w: entry["workloads"][w]["tps"] for w in WORKLOADS}
    transactions = sum(entry["workloads"][w]["transactions"] for w in WORKLOADS)
    delta = {k: after[k] - before[k] for k in after}
    return tps, transactions, delta


def series(old, new, rounds):
    means = []
    for r in rounds:
        a, ta, ca = run(f"{old}-{r}")
        b, tb, cb = run(f"{new}-{r}")
        ratios = [b[w] / a[w] for w in WORKLOADS]
        mean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        means.append(mean)
        print(f"round {r}: " + ", ".join(f"{w} {b[w]:.1f}/{a[w]:.1f} = {x:.2f}" for w, x in zip(WORKLOADS, ratios))
              + f"; geometric mean {mean:.2f}")
        for label, t, c in ((old, ta, ca), (new, tb, cb)):
            print(f"    {label}: {t} transactions, {c['drive_deflated_blocks']:.0f} blocks deflated "
                  f"({c['drive_deflated_blocks'] / t:.2f} per transaction), host CPU {c['host_seconds'] / t * 1e6:.0f} us "
                  f"and drive CPU {c['drive_seconds'] / t * 1e6:.0f} us per transaction")
    print(f"geometric means {', '.join(f'{m:.2f}' for m in means)}; median {statistics.median(means):.2f}")


if __name__ == "__main__":
    print("## the delay (1 s), no copies: delay-N over old-N")
    series("old", "delay", range(1, 6))
    print()
    print("## the delay with in-memory copies: copies-delay-N over copies-old-N")
    series("copies-old", "copies-delay", range(1, 4))
