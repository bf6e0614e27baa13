"""Prints summary.txt: per database and workload, each system's median tps of its three runs
(with the range), and the ratios of medians fuse-null / ext4, tundra-off / ext4 and
tundra-off / fuse-null."""
import json
import statistics
from pathlib import Path

here = Path(__file__).resolve().parent
results = json.loads((here / "results.json").read_text())["throughput"]
tps = {}
for entry in results:
    for wl, w in entry["workloads"].items():
        runs = [run["tps"] for run in w["runs"]]
        tps[(entry["database"], wl, entry["system"])] = runs

print("database\tworkload\text4\tfuse-null\ttundra-off\tfuse-null/ext4\ttundra-off/ext4\ttundra-off/fuse-null")
geo = {}
for db in ("postgresql", "mariadb"):
    for wl in ("oltp_write_only", "oltp_update_index", "oltp_update_non_index", "oltp_insert"):
        runs = {s: tps.get((db, wl, s)) for s in ("ext4", "fuse-null", "tundra-off")}
        if not all(runs.values()):
            continue
        med = {s: statistics.median(r) for s, r in runs.items()}
        cells = [f"{med[s]:,.0f} ({min(runs[s]):,.0f}-{max(runs[s]):,.0f})" for s in ("ext4", "fuse-null", "tundra-off")]
        ratios = (med["fuse-null"] / med["ext4"], med["tundra-off"] / med["ext4"], med["tundra-off"] / med["fuse-null"])
        for i, x in enumerate(ratios):
            geo.setdefault((db, i), []).append(x)
        print("\t".join([db, wl, *cells, *(f"{x:.2f}" for x in ratios)]))
for db in ("postgresql", "mariadb"):
    means = [statistics.geometric_mean(geo[(db, i)]) for i in range(3)]
    print(f"{db}\tgeometric mean of the four\t\t\t\t" + "\t".join(f"{x:.2f}" for x in means))
