#!/usr/bin/env python3
"""Prints each round's tps ratios, the build with the write-back cache kept by volume over the
build before it (median of three runs per workload), and their geometric mean."""
import json
import math
import pathlib

here = pathlib.Path(__file__).parent


def tps(run: str) -> dict:
    results = json.loads((here / run / "results.json").read_text())
    (entry,) = [e for e in results["throughput"] if e.get("workloads")]
    return {k.removeprefix("oltp_"): w["tps"] for k, w in entry["workloads"].items() if w}


for name, after, before in (("postgresql, round 1", "after-1", "before-1"),
                             ("postgresql, round 2", "after-2", "before-2"),
                             ("mariadb, round 1", "mariadb-after-1", "mariadb-before-1")):
    after, before = tps(after), tps(before)
    ratios = {k: after[k] / before[k] for k in after}
    mean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    print(f"{name}: {mean:.2f} (" + ", ".join(f"{k} {r:.2f}" for k, r in ratios.items()) + ")")
