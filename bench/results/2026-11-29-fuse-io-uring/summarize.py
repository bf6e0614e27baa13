#!/usr/bin/env python3
"""Prints what run.sh measured: per round and transport, Tundra-off ÷ ext4 per database and
sysbench workload (median tps of three repetitions each) with the geometric mean over the
workloads; then, per workload, Tundra-off's median tps over io_uring ÷ over /dev/fuse in each
round (ext4 alongside, as a gauge of the machine's drift between runs)."""
import json
import math
import pathlib

HERE = pathlib.Path(__file__).resolve().parent
RUNS = [("uring", 1), ("devfuse", 1), ("uring", 2), ("devfuse", 2)]


def load(name: str) -> dict:
    path = HERE / name / "results.json"
    if not path.exists():
        return {}
    tps = {}
    for entry in json.loads(path.read_text()).get("throughput", []):
        for workload, w in (entry.get("workloads") or {}).items():
            if w and "tps" in w:
                tps[(entry["database"], entry["system"], workload)] = w["tps"]
    return tps


def geomean(values: list) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    runs = {(t, r): load(f"{t}-{r}") for t, r in RUNS}
    runs = {k: v for k, v in runs.items() if v}
    databases = sorted({d for tps in runs.values() for d, _, _ in tps})
    workloads = []
    for tps in runs.values():
        for _, _, w in tps:
            if w not in workloads:
                workloads.append(w)
    print("Tundra-off ÷ ext4, median of 3, per run:\n")
    print("| database | workload | " + " | ".join(f"{t}-{r}" for t, r in runs) + " |")
    print("|---|---|" + "---|" * len(runs))
    for d in databases:
        means = {k: [] for k in runs}
        for w in workloads:
            cells = []
            for k, tps in runs.items():
                ratio = tps[(d, "tundra-off", w)] / tps[(d, "ext4", w)]
                means[k].append(ratio)
                cells.append(f"{ratio:.2f}")
            print(f"| {d} | {w} | " + " | ".join(cells) + " |")
        print(f"| {d} | geometric mean | " + " | ".join(f"**{geomean(v):.2f}**" for v in means.values()) + " |")
    print("\nio_uring ÷ /dev/fuse, median tps of 3, same round:\n")
    rounds = sorted({r for _, r in runs if ("uring", r) in runs and ("devfuse", r) in runs})
    print("| database | workload | " + " | ".join(f"tundra-off round {r} | ext4 round {r}" for r in rounds) + " |")
    print("|---|---|" + "---|---|" * len(rounds))
    for d in databases:
        gm = {r: [] for r in rounds}
        for w in workloads:
            cells = []
            for r in rounds:
                u, f = runs[("uring", r)], runs[("devfuse", r)]
                ratio = u[(d, "tundra-off", w)] / f[(d, "tundra-off", w)]
                gm[r].append(ratio)
                cells.append(f"{ratio:.2f} | {u[(d, 'ext4', w)] / f[(d, 'ext4', w)]:.2f}")
            print(f"| {d} | {w} | " + " | ".join(cells) + " |")
        print(f"| {d} | geometric mean | " + " | ".join(f"**{geomean(gm[r]):.2f}** | " for r in rounds) + " |")


if __name__ == "__main__":
    main()
