"""Medians and ranges over the runs scripts/bench-real-table wrote (run: python bench/real_table_summary.py DIR).

Reads DIR/store-run-*.json and DIR/store-tie-rate-off.json (tundra-bench store --json on one
PostgreSQL heap file) and prints the README's tables in Markdown: the space of each layout and
the read path, each figure the median of the runs with its range when the runs differ."""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def spread(values: list, fmt: str = "{:,.1f}") -> str:
    """The median, and the range in brackets when the runs differ."""
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    if lo == hi:
        return fmt.format(med)
    return f"{fmt.format(med)} [{fmt.format(lo)}–{fmt.format(hi)}]"


def summarize(runs: list, tie_off) -> str:
    if not runs:
        raise SystemExit("no store-run-*.json in the directory")
    first = runs[0]
    names = [layout["name"] for layout in first["layouts"]]
    for r in runs:
        if [layout["name"] for layout in r["layouts"]] != names or r["logical_bytes"] != first["logical_bytes"]:
            raise SystemExit("the runs measured different files or layouts")
    out = [f"{len(runs)} runs of `{first['command']}` (Tundra {first['tundra']}); "
           f"{first['files'][0]}: {first['logical_bytes']:,} bytes, {first['page_size']}-byte pages; "
           "load average before the runs: " + ", ".join(f"{r['load_average_before']:.1f}" for r in runs) + ".", ""]
    drive_only = [r["drive_only_physical_bytes"] for r in runs]
    out += ["| layout | physical bytes | ratio | vs drive only | lz4 / zstd / raw pages |", "| --- | --- | --- | --- | --- |",
            f"| drive only | {spread(drive_only, '{:,.0f}')} | "
            f"{spread([r['drive_only_ratio'] for r in runs], '{:.3f}')} | | |"]

    def row(label: str, layouts: list, bases: list) -> str:
        phys = [layout["physical_bytes"] for layout in layouts]
        vs = [100.0 * (b / p - 1.0) for b, p in zip(bases, phys)]
        mix = " / ".join(spread([layout[k] for layout in layouts], "{:,.0f}") for k in ("lz4_pages", "zstd_pages", "raw_pages"))
        return (f"| {label} | {spread(phys, '{:,.0f}')} | {spread([layout['ratio'] for layout in layouts], '{:.3f}')} | "
                f"{spread(vs, '{:+.1f}%')} | {mix} |")

    for i, name in enumerate(names):
        out.append(row(f"{name} + drive", [r["layouts"][i] for r in runs], drive_only))
    if tie_off is not None:
        adaptive = [layout for layout in tie_off["layouts"] if layout["name"] == "adaptive"]
        if adaptive:
            out.append(row("adaptive + drive, `--tie-rate off` (the paper's rule; one run)", adaptive,
                           [tie_off["drive_only_physical_bytes"]]))
    out += ["", "vs drive only: how much less the layout stores than the drive alone (positive: smaller).", ""]

    out += ["Read path, µs per 8 KiB page at queue depth 1 with the page cache off, median of the runs [range]; "
            "each read also taken apart and its parts timed on their own:", "",
            "| layout | store read | device read | decompression | the store adds | durable write (plain file: "
            f"{spread([r['plain_write_us_mean'] for r in runs])}) |",
            "| --- | --- | --- | --- | --- | --- |"]
    for i, name in enumerate(names):
        layouts = [r["layouts"][i] for r in runs]
        cells = [spread([layout[k] for layout in layouts]) for k in
                 ("read_us_mean", "device_read_us_mean", "decompress_us_mean", "read_overhead_us", "write_us_mean")]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", f"Plain file device random read: {spread([r['plain_read_us_mean'] for r in runs])} µs mean.", ""]
    return "\n".join(out)


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/real_table_summary.py DIR")
    d = Path(sys.argv[1])
    runs = [json.loads(p.read_text()) for p in sorted(d.glob("store-run-*.json"))]
    tie = d / "store-tie-rate-off.json"
    print(summarize(runs, json.loads(tie.read_text()) if tie.exists() else None))


if __name__ == "__main__":
    main()
