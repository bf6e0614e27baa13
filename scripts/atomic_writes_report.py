#!/usr/bin/env python3
"""The tables of docs/atomic-writes.md from the raw files of one results directory
(bench/results/<date>-atomic-writes/): the page write traces (trace-*.json), the torn-page
protection benchmarks (bench-*.jsonl), the torn-page rounds (torn-pages-*.jsonl) and the crash
rounds (crash-*.jsonl).

Usage: scripts/atomic_writes_report.py DIR     (prints Markdown; standard library only)

Throughput and write volume are given as the median over the runs and their range; the gain of
turning the protection off is the median of the per-pair ratios (each pair ran back to back, in
alternating order), with the range of those ratios.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import sys


def load_lines(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def spread(values: list[float], fmt: str = "{:.0f}") -> str:
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def traces(d: str) -> list[str]:
    out = ["| trace | ext4 | pages mapped | pages across two store pages | loop writes | FUSE writes | "
           "block-layer splits (inside a page) | page writes whole, one store page | whole, across store pages | "
           "partial |", "|" + " --- |" * 10]
    for path in sorted(glob.glob(os.path.join(d, "trace-*.json"))):
        t = json.load(open(path))
        placement = t["page_placement"]
        across = sum(n for k, n in placement.items() if "across" in k or "pieces" in k)
        writes = t["page_writes"]
        partial = sum(n for k, n in writes.items() if k.startswith("partial"))
        splits = t.get("block_write_splits")
        split_text = "not traced" if splits is None else f"{splits} ({t['block_write_splits_inside_a_db_page']})"
        out.append(f"| {os.path.basename(path).removesuffix('.json')} | {t.get('ext4') or 'mkfs.ext4 ' + t.get('mkfs_ext4_options', '?')} | "
                   f"{t['database_pages_mapped']} | {across} | {t['loop_write_requests']} | "
                   f"{t['fuse_write_requests']} | {split_text} | {writes.get('whole, one store page', 0)} | "
                   f"{writes.get('whole, across store pages', 0)} | {partial} |")
    return out


def bench(path: str) -> list[str]:
    rows = load_lines(path)
    if not rows:
        return []
    db = rows[0]["database"]
    key = "full_page_writes" if db == "postgresql" else "innodb_doublewrite"
    on = [r for r in rows if str(r[key]) in ("on", "1")]
    off = [r for r in rows if str(r[key]) in ("off", "0")]
    pairs = [(a, b) for a in on for b in off if a["run"] == b["run"]]
    ratio = [b["tps"] / a["tps"] for a, b in pairs]
    out = [f"**{os.path.basename(path)}** ({db}, {len(pairs)} pairs of {rows[0]['seconds']} s runs; "
           f"load average {rows[0]['loadavg_before'].split()[0]}–{rows[-1]['loadavg_after'].split()[0]})", ""]
    if db == "postgresql":
        out += ["| full_page_writes | tps | WAL bytes a transaction |", "| --- | --- | --- |"]
        for name, rs in (("on", on), ("off", off)):
            out.append(f"| {name} | {spread([r['tps'] for r in rs])} | "
                       f"{spread([r['wal_bytes_per_transaction'] for r in rs])} |")
        wal = [a["wal_bytes_per_transaction"] / b["wal_bytes_per_transaction"] for a, b in pairs]
        out += ["", f"off / on, per pair: tps {spread(ratio, '{:.3f}')}; WAL volume on / off "
                    f"{spread(wal, '{:.2f}')}"]
    else:
        out += ["| innodb_doublewrite | tps | redo bytes a transaction | bytes written a transaction | "
                "doublewrite pages |", "| --- | --- | --- | --- | --- |"]
        for name, rs in (("1", on), ("0", off)):
            out.append(f"| {name} | {spread([r['tps'] for r in rs])} | "
                       f"{spread([r['redo_bytes_per_transaction'] for r in rs])} | "
                       f"{spread([r['data_written_bytes_per_transaction'] for r in rs])} | "
                       f"{spread([r['doublewrite_pages'] for r in rs])} |")
        written = [a["data_written_bytes_per_transaction"] / b["data_written_bytes_per_transaction"] for a, b in pairs]
        out += ["", f"off / on, per pair: tps {spread(ratio, '{:.3f}')}; bytes written on / off "
                    f"{spread(written, '{:.2f}')}"]
    return out


def crashes(path: str) -> list[str]:
    rows = load_lines(path)
    acked = sum(int(r["acknowledged"]) for r in rows)
    first = rows[0] if rows else {}
    conf = first.get("pg_extra_conf", first.get("mariadb_extra_conf", ""))
    return [f"**{os.path.basename(path)}**: {len(rows)} rounds passed ({conf or 'default settings'}; "
            f"mkfs.ext4 {first.get('mkfs_ext4_options') or 'defaults'}; {first.get('page_size')} pages), "
            f"{acked} acknowledged transactions, every one found after recovery; last round: "
            f"{rows[-1]['verify'] if rows else '-'}"]


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    d = sys.argv[1]
    out = ["## Page write traces", ""] + traces(d)
    for path in sorted(glob.glob(os.path.join(d, "bench-*.jsonl"))):
        out += ["", "## " + os.path.basename(path).removesuffix(".jsonl"), ""] + bench(path)
    for path in sorted(glob.glob(os.path.join(d, "torn-pages-*.jsonl"))):
        rows = load_lines(path)
        out += ["", "## " + os.path.basename(path).removesuffix(".jsonl"), "",
                f"{len(rows)} rounds of {rows[0]['mode']} writes of {rows[0]['db_page_size']}-byte pages "
                f"({rows[0]['pages']} pages; mkfs.ext4 {rows[0]['mkfs_ext4_options'] or 'defaults'}), the node killed "
                f"after {min(r['delay_seconds'] for r in rows)}–{max(r['delay_seconds'] for r in rows)} s: "
                f"{sum(r['torn'] for r in rows)} torn pages; pages rewritten and durable at the kill, per round: "
                f"{', '.join(str(r['pages_changed']) for r in rows)}"]
    for path in sorted(glob.glob(os.path.join(d, "crash-*.jsonl"))):
        out += ["", "## " + os.path.basename(path).removesuffix(".jsonl"), ""] + crashes(path)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
