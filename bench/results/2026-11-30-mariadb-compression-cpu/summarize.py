#!/usr/bin/env python3
"""Summarizes decompose/ and cpu/ beside this file: per system the tps of each round, their
median, and the median of each round's ratio to Tundra with compression off; for cpu/, the mean
of vmstat's last six one-second lines (the first line is since boot) per run."""
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent


def tps(log: Path, workload: str) -> float:
    m = re.search(rf"{workload}: ([0-9.]+) tps", log.read_text())
    if not m:
        raise SystemExit(f"{log}: no {workload} tps")
    return float(m.group(1))


def decompose():
    systems = ["tundra-off", "tundra", "tundra-software-only", "tundra-drive-only", "tundra-drive-inline"]
    for workload in ("oltp_write_only", "oltp_update_index"):
        print(f"## decompose: MariaDB {workload}, tps per round (1, 2, 3); median; median of the rounds' ratios to tundra-off")
        base = [tps(HERE / f"decompose/r{r}-tundra-off.log", workload) for r in (1, 2, 3)]
        for system in systems:
            runs = [tps(HERE / f"decompose/r{r}-{system}.log", workload) for r in (1, 2, 3)]
            ratio = statistics.median(a / b for a, b in zip(runs, base))
            print(f"{system:<22} {', '.join(f'{t:7.1f}' for t in runs)}; median {statistics.median(runs):7.1f}; ratio {ratio:.2f}")


def vmstat(path: Path) -> dict:
    lines = [line.split() for line in path.read_text().splitlines()[2:]]
    rows = lines[1:]  # the first sample is the average since boot
    names = ["us", "sy", "id", "wa"]
    columns = [12, 13, 14, 15]
    return {n: statistics.mean(float(r[c]) for r in rows) for n, c in zip(names, columns)}


def cpu():
    print("## cpu: MariaDB oltp_write_only, per round: tps and vmstat's mean us / sy / id / wa (%)")
    ratios = []
    for r in range(1, 7):
        row = []
        values = {}
        for system in ("tundra", "tundra-off"):
            t = tps(HERE / f"cpu/{system}-{r}.log", "oltp_write_only")
            v = vmstat(HERE / f"cpu/{system}-{r}.vmstat.txt")
            values[system] = (t, v)
            row.append(f"{system} {t:7.1f} tps, us {v['us']:4.1f} sy {v['sy']:4.1f} id {v['id']:4.1f} wa {v['wa']:4.1f}")
        ratios.append(values["tundra"][0] / values["tundra-off"][0])
        print(f"round {r}: " + "; ".join(row) + f"; ratio {ratios[-1]:.2f}")
    print(f"tundra / tundra-off per round: {', '.join(f'{x:.2f}' for x in ratios)}; median {statistics.median(ratios):.2f}")
    for key in ("us", "sy", "wa"):
        a = statistics.median(vmstat(HERE / f"cpu/tundra-{r}.vmstat.txt")[key] for r in range(1, 7))
        b = statistics.median(vmstat(HERE / f"cpu/tundra-off-{r}.vmstat.txt")[key] for r in range(1, 7))
        print(f"median {key}: tundra {a:.1f}, tundra-off {b:.1f}")


if __name__ == "__main__":
    decompose()
    print()
    cpu()
