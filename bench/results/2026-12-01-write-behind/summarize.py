#!/usr/bin/env python3
"""Summarizes run.sh's rounds: per database and workload, the median tps of every run of each
build (A = BIN_A, B = BIN_B) and of ext4 over all rounds, each build's range of runs, each build's ratio to ext4, and B's
ratio to A, with the per-round B/A ratios as its spread (each round's medians of 3 runs).
Usage: python3 summarize.py OUT_DIR"""
import json
import pathlib
import statistics
import sys

out = pathlib.Path(sys.argv[1])
runs = {}  # (database, workload, build) -> [tps of every run]
rounds = {}  # (database, workload, build, round) -> median tps of that round
loads = []
for path in sorted(out.glob("*-*/results.json")):
    build, rnd = path.parent.name.split("-")
    for entry in json.loads(path.read_text())["throughput"]:
        name = "ext4" if entry["system"] == "ext4" else build
        for workload, result in entry.get("workloads", {}).items():
            tps = [r["tps"] for r in result["runs"]]
            runs.setdefault((entry["database"], workload, name), []).extend(tps)
            rounds[(entry["database"], workload, name, rnd)] = statistics.median(tps)
            loads.extend(r["load_average"] for r in result["runs"] if r.get("load_average") is not None)

print(f"# {out}: rounds {sorted({k[3] for k in rounds})}; 1-minute load average after runs "
      f"{min(loads):.1f} to {max(loads):.1f}" if loads else f"# {out}")
print("database\tworkload\text4_tps\tA_tps\tB_tps\tA_range\tB_range\tA/ext4\tB/ext4\tB/A\tB/A_per_round")
for database, workload in sorted({(k[0], k[1]) for k in runs}):
    med = {b: statistics.median(runs[(database, workload, b)]) for b in ("ext4", "A", "B")
           if (database, workload, b) in runs}
    if len(med) < 3:
        continue
    per_round = []
    for rnd in sorted({k[3] for k in rounds}):
        a, b = rounds.get((database, workload, "A", rnd)), rounds.get((database, workload, "B", rnd))
        if a and b:
            per_round.append(b / a)
    span = {b: f"{min(runs[(database, workload, b)]):.0f}-{max(runs[(database, workload, b)]):.0f}" for b in "AB"}
    print(f"{database}\t{workload}\t{med['ext4']:.0f}\t{med['A']:.0f}\t{med['B']:.0f}\t{span['A']}\t{span['B']}\t"
          f"{med['A'] / med['ext4']:.2f}\t{med['B'] / med['ext4']:.2f}\t{med['B'] / med['A']:.2f}\t"
          + ",".join(f"{r:.2f}" for r in per_round))
