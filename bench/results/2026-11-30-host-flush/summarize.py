#!/usr/bin/env python3
"""Prints the paired ratios new ÷ old of ab.sh's rounds: per database and workload, each round's
ratio and their median; per database, each round's geometric mean over the workloads and the
median of those. A round that did not run a database is left out of that database's lines."""
import json
import math
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent


def tps(directory):
    results = json.loads((directory / "results.json").read_text())
    out = {}
    for entry in results["throughput"]:
        for name, w in (entry.get("workloads") or {}).items():
            if w and "tps" in w:
                out[(entry["database"], name)] = w["tps"]
    return out


rounds = sorted(int(p.name.split("-")[1]) for p in here.glob("old-*") if p.is_dir())
pairs = {r: (tps(here / f"old-{r}"), tps(here / f"new-{r}")) for r in rounds}
keys = sorted({k for o, n in pairs.values() for k in o if k in n})
for key in keys:
    have = [r for r in rounds if key in pairs[r][0] and key in pairs[r][1]]
    ratios = [pairs[r][1][key] / pairs[r][0][key] for r in have]
    cells = [f"round {r} {x:.2f} ({pairs[r][1][key]:.0f}/{pairs[r][0][key]:.0f})" for x, r in zip(ratios, have)]
    print(f"{key[0]} | {key[1]} | " + " | ".join(cells) + f" | median {statistics.median(ratios):.2f}")
for database in sorted({k[0] for k in keys}):
    means = []
    for r in rounds:
        logs = [math.log(pairs[r][1][k] / pairs[r][0][k]) for k in keys
                if k[0] == database and k in pairs[r][0] and k in pairs[r][1]]
        if logs:
            means.append((r, math.exp(sum(logs) / len(logs))))
    print(f"{database}: geometric means by round " + ", ".join(f"{r}: {m:.2f}" for r, m in means)
          + f"; median {statistics.median(m for _, m in means):.2f}")
