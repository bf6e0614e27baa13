"""The evaluation's report: report.md with its tables and PNG plots, from results.json.

`python -m bench.eval.report DIR` rewrites DIR/report.md and DIR/*.png from DIR/results.json.
Every figure is captioned with the command, configuration, versions, machine and date of the run.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from bench.eval.stacks import NODE_CACHE  # noqa: E402

NODE_CACHE_TEXT = (f"{NODE_CACHE['page_bytes'] >> 20} MiB of decompressed pages per device and "
                   f"{NODE_CACHE['write_back']} of write-back")

MIB = 1 << 20
PALETTE = {
    "ext4": "#7f7f7f", "xfs": "#bcbd22", "btrfs-force": "#1f77b4", "btrfs-zstd": "#17becf",
    "innodb-lz4": "#9467bd", "innodb-zlib": "#8c564b", "innodb-row-compressed": "#e377c2",
    "tundra": "#d62728", "tundra-zstd": "#ff7f0e", "tundra-lz4": "#ffbb78",
    "tundra-drive-only": "#2ca02c", "tundra-software-only": "#98df8a", "tundra-off": "#c7c7c7",
    "tundra-drive-only-wal-on-data": "#393b79", "tundra-zstd-wal-on-data": "#6b6ecf",
}


def ratio(x) -> str:
    return "—" if x is None else f"{x:.2f}"


def times(x) -> str:
    return "—" if x is None else f"{x:.2f}x"


def media_bytes(sizes: dict) -> tuple:
    """(live, allocated) bytes of one measurement, each None when the run did not record it.
    Runs that record `live_bytes` and `allocated_bytes` count every store alike (a filesystem's
    `statvfs` used and image blocks; Tundra's drive records with their headers and its allocated
    segments); older runs only had Tundra's payloads and its files' host blocks."""
    if "live_bytes" in sizes or "allocated_bytes" in sizes:
        return sizes.get("live_bytes"), sizes.get("allocated_bytes")
    details = sizes.get("details", {})
    if "host_files_allocated_bytes" in details:
        return sizes.get("physical_bytes"), sum(details["host_files_allocated_bytes"].values())
    return sizes.get("fs_used_bytes"), sizes.get("physical_bytes")


def after_gc_bytes(entry: dict):
    """Allocated media at the end of a case once garbage is collected: Tundra's drive collected
    after the node stopped (`post_check.after_gc`); a filesystem's image after its last fstrim,
    which is already its collected state (the measurement after the updates)."""
    gc = (entry.get("post_check") or {}).get("after_gc")
    if gc:
        return gc.get("allocated_bytes")
    return media_bytes(entry.get("after_updates", {}))[1]


def mib(n) -> str:
    return "—" if n is None else f"{n / MIB:,.1f}"


class Report:
    def __init__(self, results: dict, out: pathlib.Path):
        self.r, self.out = results, out
        self.meta = results.get("meta", {})
        self.lines: list[str] = []
        self.figure_no = 0

    # --- helpers --------------------------------------------------------------------------
    def caption(self) -> str:
        m = self.meta
        mach = m.get("machine", {})
        return (f"`{m.get('command')}` · {m.get('date')} · Tundra {m.get('tundra', {}).get('git')}"
                f"{' (dirty)' if m.get('tundra', {}).get('dirty') else ''} · {mach.get('cpu')}, "
                f"{mach.get('nproc')} cores, Linux {mach.get('kernel')}")

    def figure(self, fig, name: str, title: str) -> None:
        self.figure_no += 1
        fig.text(0.01, 1.0, self.caption().replace("`", ""), fontsize=6, color="#555555", va="bottom")
        fig.savefig(self.out / f"{name}.png", dpi=110, bbox_inches="tight")
        plt.close(fig)
        self.lines.append(f"![Figure {self.figure_no}: {title}]({name}.png)\n")
        self.lines.append(f"*Figure {self.figure_no}: {title}.* {self.caption()}\n")

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        self.lines.append("| " + " | ".join(header) + " |")
        self.lines.append("| " + " | ".join("---" for _ in header) + " |")
        for row in rows:
            self.lines.append("| " + " | ".join(row) + " |")
        self.lines.append("")

    def ok(self, entries):
        return [e for e in entries if "error" not in e]

    def space_entries(self, database: str):
        """Space results of DATABASE: the dataset loads plus the sysbench tables."""
        entries = [e for e in self.r.get("space", []) if e["database"] == database]
        entries += [e for e in self.r.get("throughput", []) if e["database"] == database]
        return entries

    def systems_of(self, entries) -> list[str]:
        order = list(self.meta.get("systems", {}))
        present = {e["system"] for e in entries}
        return [s for s in order if s in present]

    # --- sections -------------------------------------------------------------------------
    def header(self) -> None:
        m = self.meta
        size = m.get("size", {})
        mach = m.get("machine", {})
        self.lines += [
            "# Tundra evaluation", "",
            f"Command: `{m.get('command')}`  ",
            f"Date: {m.get('date')} to {m.get('finished')}, wall time {m.get('wall_seconds', 0):,.0f} s  ",
            f"Tundra: {m.get('tundra', {}).get('git')}{' (uncommitted changes)' if m.get('tundra', {}).get('dirty') else ''}  ",
            f"Machine: {mach.get('cpu')}, {mach.get('nproc')} cores, {mach.get('ram_gib')} GiB, Linux {mach.get('kernel')}"
            + {True: " (FUSE over io_uring on)", False: " (FUSE over io_uring off)"}.get(mach.get("fuse_io_uring"), "")
            + "  ",
            "Definitions: docs/evaluation.md. Every raw number: results.json beside this file.", "",
            *[f"Note: {n}  " for n in m.get("notes", [])], *([""] if m.get("notes") else []),
            "## Configuration", "",
            f"- size `{size.get('name')}`: datasets {', '.join(m.get('datasets', []))} at scale `{size.get('scale')}`; "
            f"{size.get('update_seconds')} s of updates per dataset, sizes sampled every {size.get('sample_every')} s",
            f"- sysbench: {size.get('sysbench_tables')} tables × {size.get('sysbench_rows'):,} rows, "
            f"{size.get('threads')} threads, {size.get('workload_seconds')} s per workload: {', '.join(m.get('workloads', []))}",
            f"- databases: {', '.join(m.get('databases', []))}; each in a memory cgroup of {size.get('memory_limit')} "
            f"(page cache included; on Tundra the node's caches, cut to {NODE_CACHE_TEXT}, come out of it and the "
            f"node runs in a cgroup of its own, its peak reported under Memory), "
            f"{size.get('db_memory')} of shared_buffers / buffer pool; the kernel's caches dropped between phases",
            f"- every stack is {size.get('stack_size')} logical, built fresh for every dataset and for the sysbench run",
            "",
        ]
        versions = {}
        for e in self.r.get("space", []) + self.r.get("throughput", []):
            versions.update(e.get("versions") or {})
        if versions:
            self.lines.append("Versions: " + "; ".join(f"{k} {v}" for k, v in sorted(versions.items())) + "\n")
        rows = []
        for name, s in m.get("systems", {}).items():
            used = {e["system"] for e in self.r.get("space", []) + self.r.get("throughput", [])}
            if name in used:
                rows.append([f"`{name}`", s["description"], f"`{s['baseline']}`",
                             s["table_options"] or "—", ", ".join(f"{k}={v}" for k, v in s["settings"].items()) or "—"])
        self.table(["system", "what", "normalised to", "table options", "server settings"], rows)

    def datasets(self) -> None:
        """Rows and logical sizes of every dataset as each database stored it (on ext4)."""
        rows = []
        for e in self.ok(self.r.get("space", [])):
            if e["system"] != "ext4":
                continue
            load = e.get("load", {})
            counts = load.get("rows", {})
            logical = e["after_load"].get("logical", {})
            rows.append([e["dataset"], e["database"], str(len(counts)), f"{sum(counts.values()):,}",
                         mib(logical.get("data")), mib(logical.get("wal")), f"{load.get('seconds', 0):.1f}",
                         "ok" if load.get("checks_ok") else f"MISMATCH: {load.get('mismatches')}"])
        for e in self.ok(self.r.get("throughput", [])):
            if e["system"] != "ext4":
                continue
            logical = e["after_load"].get("logical", {})
            size = self.meta.get("size", {})
            rows.append(["sysbench", e["database"], str(size.get("sysbench_tables")),
                         f"{size.get('sysbench_tables', 0) * size.get('sysbench_rows', 0):,}",
                         mib(logical.get("data")), mib(logical.get("wal")),
                         f"{e.get('prepare', {}).get('seconds', 0):.1f}", "—"])
        if rows:
            self.lines += ["## Datasets", "",
                           "As loaded on ext4: tables, rows, the database's own files (MiB) and the load's "
                           "seconds; the row counts are checked against the source data.", ""]
            self.table(["dataset", "database", "tables", "rows", "data MiB", "WAL MiB", "load s", "check"], rows)

    def space_media(self, datasets: list, systems: list, by: dict) -> None:
        """Every store's space counted both ways, after the load and after the updates: what it
        holds live, and the media it has allocated for that; then the allocated media once
        garbage is collected, against ext4's."""
        rows = []
        for s in systems:
            row = [f"`{s}`"]
            for d in datasets:
                e = by.get((s, d))
                if e is None or "error" in e:
                    row.append("" if e is None else "failed")
                    continue
                cells = []
                for phase in ("after_load", "after_updates"):
                    live, allocated = media_bytes(e.get(phase, {}))
                    cells.append(f"{mib(live)} / {mib(allocated)}")
                gc = after_gc_bytes(e)
                base = by.get(("ext4", d))
                base_gc = after_gc_bytes(base) if base and "error" not in base else None
                vs = base_gc / gc if gc and base_gc else None
                cells.append(f"{mib(gc)} after GC, {times(vs)} vs ext4")
                row.append("<br>".join(cells))
            rows.append(row)
        self.lines += ["Space in MiB, each store counted the same way: live / allocated media after the load, "
                       "then after the updates, then the allocated media once garbage is collected. Live: what "
                       "the filesystem counts as used (`statvfs`); for Tundra the drive's live records with their "
                       "16-byte headers (`drive.physical_live_bytes`) plus the fast device's blocks of the WAL "
                       "volume. Allocated: the loop image's host blocks after fstrim; for Tundra the drive's "
                       "segments not free (`drive.physical_allocated_bytes`, garbage not yet collected included) "
                       "plus the host blocks of `fast.img` (journals, redo area and WAL volume). After GC: Tundra's "
                       "drive collected to the end once the node stopped (`tundra drive gc`), a filesystem's "
                       "image after its last fstrim. Runs from before this accounting show Tundra's payloads "
                       "and its files' host blocks instead.", ""]
        self.table(["system"] + datasets, rows)

    def space(self, database: str) -> None:
        entries = self.space_entries(database)
        if not entries:
            return
        self.lines += [f"## Space on {database} (seed 000 Figures 2 and 14)", "",
                       "Each cell: logical ÷ physical after the load → after the updates (physical as defined "
                       "in docs/evaluation.md: a filesystem's allocated image blocks, Tundra's live payloads, "
                       "which favours Tundra); below it, the allocated media once garbage is collected against "
                       "ext4's for the same dataset, each store counted the same way (higher is smaller; the "
                       "table after the figure has both counts for both phases).", ""]
        datasets = []
        for e in entries:
            if e.get("dataset") and e["dataset"] not in datasets:
                datasets.append(e["dataset"])
        by = {(e["system"], e.get("dataset")): e for e in entries}
        systems = self.systems_of(entries)
        rows = []
        for s in systems:
            row = [f"`{s}`"]
            for d in datasets:
                e = by.get((s, d))
                if e is None:
                    row.append("")
                elif "error" in e:
                    row.append("failed")
                else:
                    base = by.get(("ext4", d))
                    vs = None
                    if base and "error" not in base:
                        base_gc, gc = after_gc_bytes(base), after_gc_bytes(e)
                        vs = base_gc / gc if base_gc and gc else None
                    row.append(f"{ratio(e['after_load']['ratio'])} → {ratio(e['after_updates']['ratio'])}"
                               f"<br>{times(vs)} vs ext4")
            rows.append(row)
        self.table(["system"] + datasets, rows)
        self.space_media(datasets, systems, by)

        # Bars: ratio after load and after updates, per dataset.
        fig, axes = plt.subplots(1, len(datasets), figsize=(max(6, 3.2 * len(datasets)), 3.6), squeeze=False)
        for ax, d in zip(axes[0], datasets):
            names, load, upd = [], [], []
            for s in systems:
                e = by.get((s, d))
                if e and "error" not in e:
                    names.append(s)
                    load.append(e["after_load"]["ratio"] or 0)
                    upd.append(e["after_updates"]["ratio"] or 0)
            x = range(len(names))
            ax.bar([i - 0.2 for i in x], load, 0.4, label="after load",
                   color=[PALETTE.get(n, "#333333") for n in names])
            ax.bar([i + 0.2 for i in x], upd, 0.4, label="after updates", color=[PALETTE.get(n, "#333333") for n in names],
                   alpha=0.5, hatch="//")
            ax.set_xticks(list(x), names, rotation=60, ha="right", fontsize=7)
            ax.set_title(d, fontsize=9)
            ax.axhline(1.0, color="black", linewidth=0.5)
        axes[0][0].set_ylabel("logical ÷ physical")
        axes[0][0].legend(fontsize=7)
        self.figure(fig, f"space-{database}", f"space ratio per dataset on {database}, after the load (solid) and after the updates (hatched)")

        # Decay: ratio over time during the updates.
        decay = [d for d in datasets if any(by.get((s, d), {}).get("samples") for s in systems)]
        if decay:
            fig, axes = plt.subplots(1, len(decay), figsize=(max(6, 3.2 * len(decay)), 3.2), squeeze=False)
            for ax, d in zip(axes[0], decay):
                for s in systems:
                    e = by.get((s, d))
                    if not e or "error" in e or not e.get("samples"):
                        continue
                    pts = [(0.0, e["after_load"]["ratio"])] + [(p["t"], p["ratio"]) for p in e["samples"]]
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=s, color=PALETTE.get(s))
                ax.set_title(d, fontsize=9)
                ax.set_xlabel("seconds of updates")
            axes[0][0].set_ylabel("logical ÷ physical")
            axes[0][-1].legend(fontsize=6, loc="best")
            self.figure(fig, f"decay-{database}", f"the space ratio during sustained updates on {database}")

        # Table 3: the lz4/zstd mix Algorithm 1 chose, per dataset.
        rows = []
        for d in datasets:
            e = by.get(("tundra", d))
            mix = ((e or {}).get("after_load") or {}).get("details", {}).get("mix") if e and "error" not in e else None
            if mix:
                rows.append([d] + [f"{mix.get(k, 0) * 100:.1f}%" for k in ("raw", "lz4", "zstd")])
        if rows:
            self.lines += [f"Algorithm 1's choices on {database} after the load (seed 000 Table 3), share of pages:", ""]
            self.table(["dataset", "raw", "lz4", "zstd"], rows)

    def throughput(self, database: str) -> None:
        entries = [e for e in self.r.get("throughput", []) if e["database"] == database]
        if not entries:
            return
        workloads = self.meta.get("workloads", [])
        by = {e["system"]: e for e in entries}
        systems = self.systems_of(entries)

        def tps(s, w):
            e = by.get(s)
            if not e or "error" in e:
                return None
            run = e.get("workloads", {}).get(w)
            return run["tps"] if run else None

        def norm(s, w, base):
            a, b = tps(s, w), tps(base, w)
            return a / b if a is not None and b else None

        self.lines += [f"## Throughput on {database} (seed 000 Figure 12)", "",
                       "tps of each sysbench workload (the median of its runs), normalised to the system's uncompressed "
                       "baseline's median measured in the same run (and, for Tundra's configurations, to ext4 in "
                       "brackets); below: tps with the range of the runs, p95 latency in ms of the median run "
                       "and the machine's 1-minute load average after the run (2 cores).", ""]
        rows = []
        systems_cfg = self.meta.get("systems", {})
        for s in systems:
            base = systems_cfg.get(s, {}).get("baseline", "ext4")
            row = [f"`{s}` ÷ `{base}`"]
            for w in workloads:
                e = by[s]
                if "error" in e:
                    row.append("failed")
                    continue
                run = e.get("workloads", {}).get(w)
                if not run:
                    row.append("")
                    continue
                cell = times(norm(s, w, base))
                if base != "ext4":
                    cell += f" ({times(norm(s, w, 'ext4'))})"
                cell += f"<br>{run['tps']:,.0f} tps"
                spread = [x["tps"] for x in run.get("runs", [])]
                if len(spread) > 1:
                    cell += f" ({min(spread):,.0f}–{max(spread):,.0f}, median of {len(spread)})"
                cell += f", p95 {run.get('p95_ms')}"
                if run.get("load_average") is not None:
                    cell += f", load {run['load_average']:.1f}"
                row.append(cell)
            rows.append(row)
        self.table(["system"] + [w.replace("oltp_", "") for w in workloads], rows)

        fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(workloads)), 3.6))
        plotted = [s for s in systems if "error" not in by[s]]
        width = 0.8 / max(1, len(plotted))
        for i, s in enumerate(plotted):
            base = systems_cfg.get(s, {}).get("baseline", "ext4")
            ys = [norm(s, w, base) or 0 for w in workloads]
            ax.bar([j + i * width for j in range(len(workloads))], ys, width, label=f"{s} ÷ {base}",
                   color=PALETTE.get(s, "#333333"))
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(workloads))],
                      [w.replace("oltp_", "") for w in workloads], rotation=20, fontsize=7)
        ax.axhline(1.0, color="black", linewidth=0.5)
        ax.set_ylabel("tps ÷ baseline")
        ax.legend(fontsize=6, ncol=2)
        self.figure(fig, f"throughput-{database}", f"sysbench tps on {database}, each system ÷ its uncompressed baseline")

        steps = [(s, label) for s, label in self.meta.get("ablation", []) if s in by and "error" not in by[s]]
        if len(steps) > 1 and "tundra-off" in by:
            self.lines += [f"### Ablation on {database} (seed 000 Figure 13)", "",
                           "Each step adds one thing to the one above; tps ÷ Tundra with compression off.", ""]
            rows = []
            for s, label in steps:
                rows.append([label, f"`{s}`"] + [times(norm(s, w, "tundra-off")) for w in workloads])
            self.table(["step", "system"] + [w.replace("oltp_", "") for w in workloads], rows)
            means = {}
            for s, label in steps:
                vals = [norm(s, w, "tundra-off") for w in workloads]
                vals = [v for v in vals if v]
                if vals:
                    means[label] = statistics.geometric_mean(vals)
            if means:
                fig, ax = plt.subplots(figsize=(6, 3))
                ax.bar(range(len(means)), list(means.values()), color="#d62728")
                ax.set_xticks(range(len(means)), list(means), rotation=15, fontsize=7, ha="right")
                ax.axhline(1.0, color="black", linewidth=0.5)
                ax.set_ylabel("geomean tps ÷ tundra-off")
                self.figure(fig, f"ablation-{database}", f"the ablation on {database}: geometric mean over the workloads")

    def store(self) -> None:
        """The store alone on each dataset's PostgreSQL files: Figure 14, Table 3, Figure 5c, Figure 2."""
        entries = self.r.get("store") or []
        if not entries:
            return
        ok = self.ok(entries)
        self.lines += ["## The store alone on the datasets' files (seed 000 Figures 14, 5c and 2, Table 3)", "",
                       "Each dataset's PostgreSQL 15 relation files (tables and indexes, 8 KiB pages, built by "
                       "`scripts/datasets`) written page by page through the store (allocator, index, journal) "
                       "onto a fresh emulated drive, once per way of compressing; ratios are logical bytes over "
                       "the drive's own `physical_used_bytes`, software only over the 4 KiB blocks the store "
                       "allocated. Algorithm 1 runs as on an idle host (`tundra-bench store`); `analyze` is "
                       "`tundra analyze`'s estimate of Algorithm 1 on both layers for the same files, against "
                       "the store's measured bytes. Commands, per dataset: "
                       + "; ".join(f"`{c}`" for c in (ok[0]["commands"] if ok else [])) + ".", ""]
        # One pass: the space table (failed datasets included), the latency and the analyze tables.
        rows, latency, analyze, plot = [], [], [], []
        for e in entries:
            if "error" in e:
                rows.append([e["dataset"], "failed"] + [""] * 8)
                continue
            m = e["measure"]
            lay = {x["name"]: x for x in m["layouts"]}
            drive_only = m["drive_only_ratio"]
            alg1, zstd, lz4 = lay["adaptive"], lay["zstd"], lay["lz4"]
            est = e["analyze"]["algorithms"]["adaptive"]["dual_layer_bytes"]
            gain = (alg1["ratio"] / drive_only - 1) * 100
            extra = (alg1["physical_bytes"] / zstd["physical_bytes"] - 1) * 100
            agree = (est / alg1["physical_bytes"] - 1) * 100
            rows.append([e["dataset"], mib(m["logical_bytes"]), ratio(drive_only), ratio(alg1["software_4k_ratio"]),
                         ratio(lz4["ratio"]), ratio(zstd["ratio"]), f"{ratio(alg1['ratio'])} ({gain:+.1f}%)",
                         f"{extra:+.1f}%", f"{alg1['lz4_pages']:,} / {alg1['zstd_pages']:,} / {alg1['raw_pages']:,}",
                         f"{agree:+.2f}%"])
            plot.append((e["dataset"], drive_only, lz4["ratio"], zstd["ratio"], alg1["ratio"]))
            latency.append([e["dataset"], f"{m['plain_write_us_mean']:.0f}",
                            f"{alg1['write_us_mean']:.0f} ({alg1['write_us_mean'] / m['plain_write_us_mean']:.2f}x)",
                            f"{m['plain_read_us_mean']:.0f}",
                            f"{alg1['read_us_mean']:.0f} ({alg1['read_us_mean'] / m['plain_read_us_mean']:.2f}x)",
                            " / ".join(f"{lay[n]['decompress_us_mean']:.1f}" for n in ("lz4", "zstd", "adaptive")),
                            f"{alg1['read_overhead_us']:+.1f}"])
            f5, f2 = e["analyze"]["figure5c"], e["analyze"]["figure2"]
            sizes = {x["input_bytes"]: x["ratio"] for x in f2["input_sizes"]}
            analyze.append([e["dataset"], f"{f5['software_percent']:+.1f}%", f"{f5['software_4k_percent']:+.1f}%",
                            f"{f5['dual_layer_percent']:+.1f}%", f"{f2['granularity']['block_4k_extra_percent']:+.1f}%",
                            " / ".join(ratio(sizes.get(k)) for k in (4096, 16384, 65536, 1 << 20))])
        self.table(["dataset", "logical MiB", "drive only", "software only (Alg. 1)", "lz4 + drive", "zstd + drive",
                    "Algorithm 1 + drive (vs drive only)", "Alg. 1 stores more than zstd (Figure 14: +0.7 to +2.6%)",
                    "Alg. 1 pages lz4 / zstd / raw (Table 3)", "analyze vs store"], rows)
        if latency:
            self.lines += ["Page writes (durable, queue depth 1) and random page reads (page cache off) through the "
                           "store with Algorithm 1, against the same pages on a plain file device in the same run "
                           "(means); decompression per page; what the store adds to a read over the device read "
                           "plus the decompression (the issue's bar: 10 µs).", ""]
            self.table(["dataset", "plain write µs", "store write µs", "plain read µs", "store read µs",
                        "decompress µs lz4 / zstd / Alg. 1", "read overhead µs"], latency)
        if analyze:
            self.lines += ["How much more lz4 stores than zstd at each layer (seed 000 Figure 5c: +58.9% in software, "
                           "+9.0% after the drive), how much more a 4 KiB-granular index stores than a byte-granular "
                           "one on 16 KiB inputs (Figure 2a: +80.5%), and zstd's ratio by input size (Figure 2b), "
                           "from `tundra analyze`.", ""]
            self.table(["dataset", "lz4 over zstd: software", "in 4 KiB blocks", "after the drive",
                        "4 KiB index over byte index", "zstd ratio at 4 KiB / 16 KiB / 64 KiB / 1 MiB"], analyze)
        if plot:
            fig, ax = plt.subplots(figsize=(7, 3.2))
            labels = ("drive only", "lz4 + drive", "zstd + drive", "Algorithm 1 + drive")
            colors = ("#2ca02c", "#ffbb78", "#ff7f0e", "#d62728")
            for i, (label, color) in enumerate(zip(labels, colors)):
                ax.bar([x + (i - 1.5) * 0.2 for x in range(len(plot))], [p[i + 1] for p in plot], 0.2,
                       label=label, color=color)
            ax.set_xticks(range(len(plot)), [p[0] for p in plot])
            ax.set_ylabel("logical ÷ physical")
            ax.legend(fontsize=7)
            self.figure(fig, "store-ratios", "the store alone: compression ratio per dataset and layout (Figure 14)")

    def drive(self) -> None:
        d = self.r.get("drive")
        if not d or not d.get("latency"):
            return
        pts = d["latency"]
        self.lines += ["## The drive alone (seed 000 Figure 7)", "",
                       f"`{d.get('command')}`: 16 KiB I/O at queue depth 1 on the emulated drive and on a plain "
                       f"file in the same run ({d.get('configuration')}).", ""]
        rows = [[f"{p['target_ratio']:.1f}", f"{p['achieved_ratio']:.2f}",
                 f"{p['drive_read_p50_us']:.0f} / {p['plain_read_p50_us']:.0f}",
                 f"{p['drive_write_p50_us']:.0f} / {p['plain_write_p50_us']:.0f}",
                 f"{p['drive_read_p99_us']:.0f} / {p['plain_read_p99_us']:.0f}",
                 f"{p['drive_write_p99_us']:.0f} / {p['plain_write_p99_us']:.0f}"] for p in pts]
        self.table(["target ratio", "achieved", "read p50 µs drive / plain", "write p50",
                    "read p99", "write p99"], rows)
        fig, ax = plt.subplots(figsize=(6, 3.2))
        xs = [p["target_ratio"] for p in pts]
        for key, label, style in (("drive_read_p50_us", "drive read p50", "o-"), ("plain_read_p50_us", "plain read p50", "o--"),
                                  ("drive_write_p50_us", "drive write p50", "s-"), ("plain_write_p50_us", "plain write p50", "s--")):
            ax.plot(xs, [p[key] for p in pts], style, label=label)
        ax.set_xlabel("compressibility of the data")
        ax.set_ylabel("µs")
        ax.legend(fontsize=7)
        self.figure(fig, "drive-latency", "16 KiB latency of the emulated drive against a plain file, by compressibility")

    def losses(self) -> None:
        """Every place a peer beats Tundra (Algorithm 1, both layers), stated plainly."""
        if not self.r.get("space") and not self.r.get("throughput"):
            return
        notes = []
        for database in self.meta.get("databases", []):
            entries = self.ok(self.space_entries(database))
            by = {(e["system"], e.get("dataset")): e for e in entries}
            for (s, d), e in by.items():
                t = by.get(("tundra", d))
                if s.startswith("tundra") or t is None:
                    continue
                for phase in ("after_load", "after_updates"):
                    counts = list(zip(("live", "allocated"), media_bytes(e[phase]), media_bytes(t[phase])))
                    counts.append(("physical (docs/evaluation.md)", e[phase]["physical_bytes"], t[phase]["physical_bytes"]))
                    for what, peer, ours in counts:
                        if peer is not None and ours is not None and peer < ours:
                            notes.append(f"{database}, {d}, {phase.replace('_', ' ')}, {what}: `{s}` holds "
                                         f"{mib(peer)} MiB against Tundra's {mib(ours)} MiB.")
                peer, ours = after_gc_bytes(e), after_gc_bytes(t)
                if peer is not None and ours is not None and peer < ours:
                    notes.append(f"{database}, {d}, allocated after GC: `{s}` holds {mib(peer)} MiB against "
                                 f"Tundra's {mib(ours)} MiB.")
            tp = {e["system"]: e for e in self.ok([e for e in self.r.get("throughput", []) if e["database"] == database])}
            t = tp.get("tundra")
            if t:
                for s, e in tp.items():
                    if s.startswith("tundra"):
                        continue
                    for w, run in e.get("workloads", {}).items():
                        mine = t.get("workloads", {}).get(w)
                        if mine and run["tps"] > mine["tps"]:
                            notes.append(f"{database}, {w}: `{s}` {run['tps']:,.0f} tps against Tundra's {mine['tps']:,.0f}.")
        self.lines += ["## Where a peer beats Tundra", ""]
        if notes:
            self.lines += [f"- {n}" for n in notes] + [""]
        else:
            self.lines += ["No peer used less space or ran faster than Tundra in this run.", ""]

    def memory(self) -> None:
        """The peak of each budget and of each Tundra node beside it, over the phases measured."""
        rows = []
        for kind in ("space", "throughput"):
            for e in self.r.get(kind, []):
                phases = ([e.get("memory")] if kind == "space" else
                          [run.get("memory") for run in e.get("workloads", {}).values()])
                phases = [m for m in phases if m]
                if not phases:
                    continue
                db_peak = max(m.get("max_usage_bytes") or 0 for m in phases)
                node_peak = max((m.get("node") or {}).get("max_usage_bytes") or 0 for m in phases)
                what = e.get("dataset") if kind == "space" else "sysbench"
                rows.append([e["database"], f"`{e['system']}`", what, mib(phases[0].get("limit_bytes")),
                             mib(db_peak), mib(node_peak) if node_peak else "—"])
        if not rows:
            return
        self.lines += ["## Memory", "",
                       "The peak of the database's budget (its limit, with a Tundra node's caches taken out of it "
                       "for Tundra) and of the Tundra node's own cgroup, over the phases measured.", ""]
        self.table(["database", "system", "phase", "budget", "database peak", "node peak"], rows)

    def problems(self) -> None:
        self.lines += ["## Problems", ""]
        probs = self.r.get("problems", [])
        self.lines += ([f"- {p}" for p in probs] if probs else
                       ["None: every system set up, loaded, ran and passed its checks "
                        "(pg_amcheck or CHECK TABLE, and `tundra fsck` after every Tundra run)."]) + [""]

    def extras(self) -> None:
        """The README's other benchmarks, run by `--full` into directories of this run."""
        extras = self.r.get("extras")
        if not extras:
            return
        reports = {"drive": "summary.md", "drive-gc": "summary.md", "real-table": "summary.md",
                   "block-path": "report.md", "pg-storage": "report.md"}
        self.lines += ["## The README's other benchmarks", "",
                       "Each run by its own command into a directory beside this report, with its raw files "
                       "and its own summary:", ""]
        rows = []
        for e in extras:
            status = f"failed: {e['error']}" if "error" in e else f"[{reports.get(e['name'], '')}]({e['dir']}/{reports.get(e['name'], '')})"
            env = " ".join(f"{k}={v}" for k, v in e.get("env", {}).items())
            rows.append([e["name"], f"`{(env + ' ') if env else ''}{e['command']}`", f"{e['seconds']:,.0f}", status])
        self.table(["benchmark", "command", "s", "result"], rows)

    def write(self) -> pathlib.Path:
        self.header()
        self.datasets()
        for database in self.meta.get("databases", []):
            self.space(database)
            self.throughput(database)
        self.store()
        self.drive()
        self.extras()
        self.memory()
        self.losses()
        self.problems()
        path = self.out / "report.md"
        path.write_text("\n".join(self.lines) + "\n")
        return path


def write_report(results: dict, out: pathlib.Path) -> pathlib.Path:
    return Report(results, out).write()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m bench.eval.report DIR (holding results.json)")
    d = pathlib.Path(sys.argv[1])
    print(write_report(json.loads((d / "results.json").read_text()), d))
