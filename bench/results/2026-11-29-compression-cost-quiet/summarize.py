#!/usr/bin/env python3
"""Prints, for each run in this directory, every Tundra configuration's tps over Tundra with
compression off: the geometric mean over the run's workloads of the per-workload median ratios,
then each workload's ratio. Usage: python3 summarize.py [DIR]"""
import json
import math
import pathlib
import sys

here = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent)
for results in sorted(here.glob("*/results.json")):
    runs = json.loads(results.read_text())
    tps = {e["system"]: {k: w["tps"] for k, w in e["workloads"].items() if w and "tps" in w}
           for e in runs["throughput"] if e.get("workloads")}
    base = tps["tundra-off"]
    print(f"== {results.parent.name}")
    for system, by_workload in tps.items():
        ratios = {k: v / base[k] for k, v in by_workload.items() if base.get(k)}
        mean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
        cells = ", ".join(f"{k.removeprefix('oltp_')} {r:.2f}" for k, r in ratios.items())
        print(f"{system} ÷ tundra-off: {mean:.2f} ({cells})")
