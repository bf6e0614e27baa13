#!/usr/bin/env python3
"""Prints this directory's tables from its raw results.json files:
python3 bench/results/2026-11-29-fuse-null-and-cache/summarize.py"""
import json
import pathlib
import statistics

HERE = pathlib.Path(__file__).parent
WRITES = ("oltp_write_only", "oltp_update_index", "oltp_update_non_index", "oltp_insert")


def runs(path):
    r = json.loads(path.read_text())
    out = {}
    for t in r["throughput"]:
        for w, x in t["workloads"].items():
            out[(t["database"], t["system"], w)] = [run["tps"] for run in x["runs"]]
    return out


def ratio(a, b):
    r = [x / y for x, y in zip(a, b)]
    return f"{statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]"


print("Ratios per repetition in one bench/run (median [min-max] of 3), before/ and after/:\n")
print("| run | database | workload | fuse-null / ext4 | tundra-off / ext4 | tundra-off / fuse-null |")
print("|---|---|---|---|---|---|")
for name in ("before", "after"):
    tp = runs(HERE / name / "results.json")
    for db in ("mariadb", "postgresql"):
        for w in WRITES:
            e, f, t = (tp.get((db, s, w)) for s in ("ext4", "fuse-null", "tundra-off"))
            if e and f and t:
                print(f"| {name} | {db} | {w} | {ratio(f, e)} | {ratio(t, e)} | {ratio(t, f)} |")

print("\nab/: mariadb on tundra-off, old and new binary alternated, one run each per round (tps):\n")
print("| workload | old (3 rounds) | new (3 rounds) | new / old, medians |")
print("|---|---|---|---|")
for w in ("oltp_update_non_index", "oltp_insert", "oltp_write_only"):
    old = [runs(HERE / "ab" / f"old-{i}" / "results.json")[("mariadb", "tundra-off", w)][0] for i in (1, 2, 3)]
    new = [runs(HERE / "ab" / f"new-{i}" / "results.json")[("mariadb", "tundra-off", w)][0] for i in (1, 2, 3)]
    fmt = lambda xs: ", ".join(f"{x:,.0f}" for x in xs)
    print(f"| {w} | {fmt(old)} | {fmt(new)} | {statistics.median(new) / statistics.median(old):.2f} |")
