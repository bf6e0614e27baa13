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


for round_ in (1, 2):
    after, before = tps(f"after-{round_}"), tps(f"before-{round_}")
    ratios = {k: after[k] / before[k] for k in after}
    mean = math.exp(sum(math.log(r) for r in ratios.values()) / len(ratios))
    print(f"round {round_}: {mean:.2f} (" + ", ".join(f"{k} {r:.2f}" for k, r in ratios.items()) + ")")
