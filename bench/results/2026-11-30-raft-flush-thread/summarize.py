#!/usr/bin/env python3
"""Prints summary.txt: per configuration, each round's single_us_p50 / replicated_us_p50 /
extra_us from CONFIG-ROUND.txt beside this file (cluster_bench's replication.txt of that round),
and their medians."""
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
rows = {}
for path in sorted(HERE.glob("*-[0-9].txt")):
    name, round_ = path.stem.rsplit("-", 1)
    lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    values = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
    rows.setdefault(name, []).append((int(round_), values))
print("config: per round (1-5) single_us_p50 / replicated_us_p50 / extra_us; medians")
for name in ("inline", "thread-2-workers", "thread-1-worker"):
    runs = sorted(rows[name])
    print(name + ": " + "; ".join(f"{v['single_us_p50']}/{v['replicated_us_p50']}/{v['extra_us']}" for _, v in runs))
    for key in ("single_us_p50", "replicated_us_p50", "extra_us", "extra_over_budget"):
        print(f"   median {key}: {statistics.median(float(v[key]) for _, v in runs):g}")
