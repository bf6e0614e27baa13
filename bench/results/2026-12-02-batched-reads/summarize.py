"""Medians of ab.txt: IOPS per job and build, the after/before ratio per round, device reads per I/O.
Usage: python3 summarize.py ab.txt"""
import statistics
import sys

rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line[0].isdigit()]
jobs = sorted({r[2] for r in rows})
for job in jobs:
    by = {}
    for rnd, side, j, iops, per in rows:
        if j == job:
            by.setdefault(rnd, {})[side] = (float(iops), float(per))
    before = sorted(v["before"][0] for v in by.values())
    after = sorted(v["after"][0] for v in by.values())
    ratio = sorted(v["after"][0] / v["before"][0] for v in by.values())
    per_b = statistics.median(v["before"][1] for v in by.values())
    per_a = statistics.median(v["after"][1] for v in by.values())
    print(f"{job}: before {statistics.median(before):.0f} IOPS ({before[0]:.0f} to {before[-1]:.0f}), "
          f"{per_b:.2f} device reads per I/O; after {statistics.median(after):.0f} ({after[0]:.0f} to {after[-1]:.0f}), "
          f"{per_a:.2f}; after/before per round {statistics.median(ratio):.2f} ({ratio[0]:.2f} to {ratio[-1]:.2f})")
