"""The block path, step by step: how each change between a database and Tundra's store moves
throughput and latency, against ext4 on a loop file measured in the same run.

Steps (each a stack of bench/eval/stacks.py, compression off unless said):

0. `fuse-null`: the in-process FUSE export with a plain O_DIRECT host file behind it instead of
   the store (`tundra bench null-export`, hidden): what FUSE and the loop device cost alone;
1. `tundra-off-nbdfuse-serial`: NBD through nbdfuse, one request in flight per connection (the
   server as it was);
2. `tundra-off-nbdfuse`: the same with requests side by side and out-of-order replies;
3. `tundra-off`: the volume mounted as a file in the node's process (no nbdfuse, no TCP);
4. `tundra-drive-inline`: both compression layers, the drive deflating in the writer's thread;
5. `tundra`: both layers, the drive deflating on its own thread (the default).

Each stack is built fresh for each repetition, in an order rotated between repetitions, and
measured with fio on one file written whole first (FIO_JOBS: random 8 KiB writes each followed
by fdatasync, by two writers and by one, its sync latency the write path's; random direct reads
and writes of 4 and 8 KiB at queue depth 1 and 16, sequential reads of 128 KiB and random ones
of 64 KiB, each of many pages), the serving processes' CPU per fio I/O, then
PostgreSQL 15 in a 256 MiB memory cgroup: `pgbench -i` and a `pgbench` run. Every figure is the
median of the repetitions with its min and max; /proc/loadavg is recorded before each
measurement. For Tundra stacks, `tundra stats --json` after the run gives the drive's CPU apart
from the host software's.

The re-choice experiment (`--rechoose`): PostgreSQL loads a real dataset (`--rechoose-dataset`,
nycflights13 by default; `tpch:full` is the TPC-H sf 1 run where 59% of the pages stayed raw) on
`tundra-busy` and `tundra-busy-rechoose` (Algorithm 1 told the host is always busy, so every page
is written with lz4 without a comparison; the second runs the pass that chooses them again), then
pgbench runs while the pass works; the space after the pass settles and the tps are compared.

`--perf` records `perf record -g` of the serving processes during PERF_JOBS (perf-JOB.txt in
the step's logs); `--before-bin PATH` runs each step named `STEP@before` with that tundra binary,
just before STEP in the same repetitions, to measure a change against the build before it.

Usage (root, from the repository): bench/block-path [--quick|--full] [--reps N] [--rechoose] [--out DIR];
`bench/block-path --report-only DIR` rewrites DIR/report.md from DIR/results.json.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench.eval import common  # noqa: E402
from bench.eval.common import REPO, BenchError, log, run  # noqa: E402

STEPS = ["ext4", "fuse-null", "tundra-off-nbdfuse-serial", "tundra-off-nbdfuse", "tundra-off", "tundra-drive-inline", "tundra"]
# Each step's predecessor, for the step-over-step ratio.
PREVIOUS = {"tundra-off-nbdfuse": "tundra-off-nbdfuse-serial", "tundra-off": "tundra-off-nbdfuse",
            "tundra-drive-inline": "tundra-off", "tundra": "tundra-drive-inline"}
RECHOOSE_STACKS = ["tundra-busy", "tundra-busy-rechoose"]

SIZES = {
    "quick": {"fio_seconds": 8, "fio_file": "256M", "pgbench_scale": 5, "pgbench_seconds": 15, "stack": "4GiB",
              "rechoose_settle_seconds": 240},
    "full": {"fio_seconds": 30, "fio_file": "1G", "pgbench_scale": 50, "pgbench_seconds": 60, "stack": "8GiB",
             "rechoose_settle_seconds": 900},
}


def loadavg() -> str:
    return " ".join(pathlib.Path("/proc/loadavg").read_text().split()[:3])


def fio(directory: pathlib.Path, name: str, args: list[str], seconds: int, size: str, bs: str = "8k") -> dict:
    """One fio job on the file `bench.dat` in DIRECTORY (laid out by the first job, shared by
    the rest); its JSON report's job."""
    cmd = ["fio", f"--name={name}", f"--directory={directory}", "--filename=bench.dat", f"--size={size}",
           f"--bs={bs}", "--time_based", f"--runtime={seconds}", "--output-format=json",
           "--buffer_compress_percentage=50", "--buffer_compress_chunk=4096", "--refill_buffers", "--randrepeat=0",
           *args]
    p = run(cmd, what=f"fio {name}", timeout=seconds + 600)
    report = json.loads(p.stdout[p.stdout.index("{"):])
    job = report["jobs"][0]
    job["command"] = shlex.join(cmd)
    return job


def p99_ms(section: dict, key: str = "clat_ns") -> float | None:
    pct = (section.get(key) or {}).get("percentile") or {}
    value = pct.get("99.000000")
    return None if value is None else value / 1e6


# The fio jobs: (name, block size, arguments). `write-sync` and `read` are the jobs of the
# earlier runs (bench/results/2026-11-28-block-path); the rest split them by request size and
# queue depth. Writes without fdatasync are direct random writes (what a database's background
# writer sends); `write-sync-qd1` is one writer committing, as a single client's COMMIT.
AIO = ["--ioengine=libaio", "--direct=1"]
FIO_JOBS = [
    ("write-sync", "8k", ["--rw=randwrite", "--ioengine=psync", "--fdatasync=1", "--numjobs=2", "--group_reporting"]),
    ("write-sync-qd1", "8k", ["--rw=randwrite", "--ioengine=psync", "--fdatasync=1"]),
    ("read", "8k", ["--rw=randread", *AIO, "--iodepth=16"]),
    ("read-8k-qd1", "8k", ["--rw=randread", *AIO, "--iodepth=1"]),
    ("read-4k-qd1", "4k", ["--rw=randread", *AIO, "--iodepth=1"]),
    ("read-4k-qd16", "4k", ["--rw=randread", *AIO, "--iodepth=16"]),
    ("write-8k-qd1", "8k", ["--rw=randwrite", *AIO, "--iodepth=1"]),
    ("write-8k-qd16", "8k", ["--rw=randwrite", *AIO, "--iodepth=16"]),
    ("write-4k-qd1", "4k", ["--rw=randwrite", *AIO, "--iodepth=1"]),
    ("write-4k-qd16", "4k", ["--rw=randwrite", *AIO, "--iodepth=16"]),
    # Reads of many pages at once: a table scan's sequential reads, and random ones of 64 KiB.
    ("read-128k-seq", "128k", ["--rw=read", *AIO, "--iodepth=1"]),
    ("read-64k-qd1", "64k", ["--rw=randread", *AIO, "--iodepth=1"]),
]
# The jobs `--perf` profiles the serving processes during.
PERF_JOBS = ("write-sync-qd1", "read-8k-qd1", "write-8k-qd16")


def cpu_ticks(pids: list[int]) -> int | None:
    """User plus system CPU of the processes PIDS (every thread), in clock ticks."""
    total = 0
    for pid in pids:
        try:
            fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        total += int(fields[11]) + int(fields[12])
    return total


class Profiler:
    """`perf record -g` on the serving processes for one fio job; `perf report` (self time,
    the top symbols) is kept beside the logs, the raw data removed."""

    def __init__(self, pids: list[int], out: pathlib.Path, job: str):
        self.data = out / f"perf-{job}.data"
        self.text = out / f"perf-{job}.txt"
        self.proc = subprocess.Popen(["perf", "record", "-g", "-o", str(self.data), "-p",
                                      ",".join(str(p) for p in pids)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)

    def finish(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, 2)  # SIGINT: perf writes its data out and exits
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            common.stop_pid(self.proc.pid, "perf record", timeout=10)
        p = subprocess.run(["perf", "report", "-i", str(self.data), "--stdio", "--no-children", "-g", "none",
                            "--percent-limit", "0.5", "--sort", "dso,symbol"], capture_output=True, text=True,
                           timeout=600)
        self.text.write_text(p.stdout + p.stderr[-2000:])
        self.data.unlink(missing_ok=True)


def fio_workloads(mount: pathlib.Path, size: dict, pids: list[int], perf_dir: pathlib.Path | None) -> dict:
    """Every job of FIO_JOBS; with the serving processes' PIDS, their CPU per fio I/O (µs)."""
    d = mount / "fio"
    d.mkdir(exist_ok=True)
    out = {"loadavg": loadavg()}
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    # The file every job shares, written whole first: fio only preallocates a file for a write
    # job, and ext4 answers reads of its unwritten extents with zeros without any I/O, which
    # made a stack that wrote less look faster at reading.
    layout = ["fio", "--name=layout", f"--directory={d}", "--filename=bench.dat", f"--size={size['fio_file']}",
              "--bs=1M", "--rw=write", "--ioengine=libaio", "--direct=1", "--iodepth=4", "--end_fsync=1",
              "--buffer_compress_percentage=50", "--buffer_compress_chunk=4096", "--refill_buffers",
              "--output-format=json"]
    t0 = time.monotonic()
    run(layout, what="fio layout", timeout=1800)
    out["layout"] = {"seconds": time.monotonic() - t0, "command": shlex.join(layout)}
    for name, bs, args in FIO_JOBS:
        profiler = Profiler(pids, perf_dir, name) if perf_dir is not None and pids and name in PERF_JOBS else None
        before = cpu_ticks(pids) if pids else None
        j = fio(d, name, args, size["fio_seconds"], size["fio_file"], bs)
        after = cpu_ticks(pids) if pids else None
        if profiler is not None:
            profiler.finish()
        direction = "read" if {"--rw=randread", "--rw=read"} & set(args) else "write"
        section = j[direction]
        ios = section.get("total_ios") or 0
        r = {"iops": section["iops"], f"{direction}_p99_ms": p99_ms(section), "command": j["command"],
             "ios": ios, "cpu_us_per_io": None}
        if before is not None and after is not None and ios:
            r["cpu_us_per_io"] = (after - before) * tick_us / ios
        if "fdatasync" in " ".join(args):
            r["sync_p99_ms"] = p99_ms(j.get("sync") or {}, "lat_ns")
        out[name.replace("-", "_")] = r
    return out


def pgbench(db, size: dict, seconds: int | None = None) -> dict:
    """pgbench -i at the size's scale (timed), then a run of 4 clients; tps and mean latency."""
    base = ["-h", str(db.run_dir), "-p", str(db.port), "-U", "postgres"]
    t0 = time.monotonic()
    run([db.bin("pgbench"), *base, "-i", "-q", "-s", str(size["pgbench_scale"]), "postgres"], what="pgbench -i",
        timeout=3600)
    init_seconds = time.monotonic() - t0
    seconds = seconds or size["pgbench_seconds"]
    load = loadavg()
    cmd = [db.bin("pgbench"), *base, "-c", "4", "-j", "2", "-T", str(seconds), "postgres"]
    p = run(cmd, what="pgbench", timeout=seconds + 600)
    tps = re.search(r"tps = ([\d.]+)", p.stdout)
    lat = re.search(r"latency average = ([\d.]+) ms", p.stdout)
    if not tps:
        raise BenchError(f"pgbench printed no tps: {p.stdout[-300:]}")
    return {"init_seconds": init_seconds, "tps": float(tps.group(1)), "latency_ms": float(lat.group(1)) if lat else None,
            "loadavg": load, "command": shlex.join(cmd), "scale": size["pgbench_scale"]}


def tundra_stats(stack) -> dict | None:
    if not hasattr(stack, "_stats"):
        return None
    s = stack._stats()
    return {k: s.get(k) for k in ("configuration", "cpu", "mounts", "rechoose", "drive", "compressed", "ratio",
                                  "software_ratio", "drive_ratio", "journals")}


def journal_sum(r: dict, field: str):
    """A journal counter summed over the node's two stores (None for a build without them)."""
    journals = (r.get("tundra") or {}).get("journals")
    if not journals:
        return None
    return sum(j.get(field, 0) for j in journals.values())


class Bench:
    def __init__(self, a, out: pathlib.Path):
        self.a, self.out = a, out
        self.size = SIZES[a.size]
        self.rechoose_dataset = rechoose_dataset(a.rechoose_dataset)
        self.work = pathlib.Path(a.work_dir) / f"tundra-block-path.{os.getpid()}"
        self.tundra_bin = self.work / "bin" / "tundra"
        self.before_bin = self.work / "bin" / "tundra-before"
        self.ports = {}
        port = 24000 + os.getpid() % 1000 * 10
        for name in ("nbd", "native", "metrics", "db"):
            while not common.port_free(port):
                port += 1
            self.ports[name] = port
            port += 1

    def with_stack(self, name: str, tag: str, body) -> dict:
        from bench.eval.databases import make_database
        from bench.eval.stacks import make_stack
        work, logs = self.work / tag, self.out / "logs" / tag
        work.mkdir(parents=True)
        logs.mkdir(parents=True)
        # `STACK@before`: the stack with the binary of --before-bin (a change measured against
        # the build before it, in the same repetitions).
        stack_name, _, variant = name.partition("@")
        tundra_bin = self.before_bin if variant == "before" else self.tundra_bin
        stack = make_stack(stack_name, work_dir=work / "stack", size_bytes=common.parse_size(self.size["stack"]),
                           tundra_bin=tundra_bin, ports=self.ports, log_dir=logs, page_size=8192)
        result: dict = {"stack": name}
        cgroup = db = None
        try:
            stack.setup()
            cgroup = common.MemoryCgroup(f"block-path.{name}", common.parse_size("256MiB"))
            db = make_database("postgresql", name=tag, data_dir=stack.data_mount / "db",
                               wal_dir=stack.wal_mount / "wal", run_dir=work / "run", port=self.ports["db"],
                               cgroup=cgroup, settings={"shared_buffers": "32MiB"}, log_dir=logs)
            result.update(body(stack, db))
            result["tundra"] = tundra_stats(stack)
            db.stop()
        except BenchError as e:
            result["error"] = str(e)
            log(f"{tag}: FAILED: {e}")
        finally:
            if db is not None:
                try:
                    db.stop()
                except BenchError as e:
                    log(f"{tag}: stopping PostgreSQL: {e}")
            try:
                stack.teardown()
                result["post_check"] = stack.post_check()
            except BenchError as e:
                result.setdefault("error", str(e))
                log(f"{tag}: FAILED after the run: {e}")
            if cgroup is not None:
                cgroup.remove()
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
        return result

    def step_run(self, name: str, rep: int) -> dict:
        def body(stack, db):
            pids = stack.server_pids() if hasattr(stack, "server_pids") else []
            perf_dir = self.out / "logs" / f"{name}.{rep}" if self.a.perf else None
            r = {"fio": fio_workloads(stack.data_mount, self.size, pids, perf_dir)}
            db.init()
            db.start()
            r["pgbench"] = pgbench(db, self.size)
            return r
        log(f"step {name}, repetition {rep + 1}")
        return self.with_stack(name, f"{name}.{rep}", body)

    def rechoose_run(self, name: str, rep: int) -> dict:
        def body(stack, db):
            db.init()
            db.start()
            t0 = time.monotonic()
            dataset, scale = self.rechoose_dataset
            loaded = db.load_dataset(dataset, scale)
            r = {"load": {k: loaded.get(k) for k in ("seconds", "checks_ok")}, "load_seconds": time.monotonic() - t0}
            db.checkpoint()
            os.sync()
            r["after_load"] = tundra_stats(stack)
            # pgbench while the pass has the loaded pages to work through.
            r["pgbench"] = pgbench(db, self.size)
            r["after_pgbench"] = tundra_stats(stack)
            deadline = time.monotonic() + self.size["rechoose_settle_seconds"]
            while time.monotonic() < deadline:
                s = tundra_stats(stack)
                if not s["rechoose"]["pending_pages"] and not s["drive"]["deferred_pending_blocks"]:
                    break
                time.sleep(2)
            db.checkpoint()
            os.sync()
            stack.trim()
            r["settled"] = tundra_stats(stack)
            sizes = stack.sizes()
            r["sizes"] = {k: sizes[k] for k in ("physical_bytes", "data_physical_bytes", "fs_used_bytes")}
            r["data_volume"] = sizes["details"]["volumes"]["data"]
            return r
        log(f"re-choice {name}, repetition {rep + 1}")
        return self.with_stack(name, f"{name}.{rep}", body)


def rechoose_dataset(spec: str) -> tuple:
    """`NAME[:SCALE]` of --rechoose-dataset as (name, scale): scripts/datasets' names and scales."""
    name, _, scale = spec.partition(":")
    scale = scale or "quick"
    if name not in ("tpch", "tpcds", "nycflights13", "wikipedia") or scale not in ("quick", "full"):
        raise SystemExit(f"bench/block-path: --rechoose-dataset {spec!r}: use tpch, tpcds, nycflights13 or "
                         "wikipedia, optionally with :quick or :full")
    return name, scale


def register_before_steps(names: list[str]) -> None:
    """Places each `STEP@before` among STEPS just before STEP, as STEP's previous step."""
    for name in names:
        base = name.removesuffix("@before")
        if name != base and name not in STEPS and base in STEPS:
            STEPS.insert(STEPS.index(base), name)
            PREVIOUS[base] = name


def median_spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values),
            "values": values}


def summarize(runs: list[dict]) -> dict:
    by_stack: dict = {}
    for r in runs:
        if "error" in r:
            continue
        by_stack.setdefault(r["stack"], []).append(r)
    metrics = {
        "write_sync_iops": lambda r: r["fio"]["write_sync"]["iops"],
        "write_sync_sync_p99_ms": lambda r: r["fio"]["write_sync"]["sync_p99_ms"],
        "write_sync_write_p99_ms": lambda r: r["fio"]["write_sync"]["write_p99_ms"],
        "read_iops": lambda r: r["fio"]["read"]["iops"],
        "read_p99_ms": lambda r: r["fio"]["read"]["read_p99_ms"],
        "pgbench_tps": lambda r: r["pgbench"]["tps"],
        "pgbench_init_seconds": lambda r: r["pgbench"]["init_seconds"],
        "drive_cpu_seconds": lambda r: (r.get("tundra") or {}).get("cpu", {}).get("drive_seconds"),
        "host_cpu_seconds": lambda r: (r.get("tundra") or {}).get("cpu", {}).get("host_seconds"),
        "journal_group_commits": lambda r: journal_sum(r, "group_commits"),
        "journal_data_flushes": lambda r: journal_sum(r, "data_flushes"),
        "journal_carried_images": lambda r: journal_sum(r, "carried_images"),
    }
    for job, _, _ in FIO_JOBS:
        key = job.replace("-", "_")
        for field in ("iops", "cpu_us_per_io"):
            metrics[f"{key}_{field}"] = (lambda k, f: lambda r: (r["fio"].get(k) or {}).get(f))(key, field)
    out = {}
    for stack, rs in by_stack.items():
        out[stack] = {m: median_spread([f(r) for r in rs]) for m, f in metrics.items()}
    # Ratios per repetition (same repetition, same conditions), then their median and spread.
    ratios: dict = {}
    matrix = [f"{job.replace('-', '_')}_iops" for job, _, _ in FIO_JOBS]
    for stack in out:
        for base_name, base in (("ext4", "ext4"), ("previous", PREVIOUS.get(stack)), ("fuse_null", "fuse-null")):
            if base is None or base not in by_stack or stack == base:
                continue
            for m in ("write_sync_iops", "read_iops", "pgbench_tps", "write_sync_sync_p99_ms", *matrix):
                per_rep = []
                for r in by_stack[stack]:
                    b = next((x for x in by_stack[base] if x["rep"] == r["rep"]), None)
                    if b is not None and metrics[m](b) and metrics[m](r) is not None:
                        per_rep.append(metrics[m](r) / metrics[m](b))
                ratios.setdefault(stack, {})[f"{m}_vs_{base_name}"] = median_spread(per_rep)
    return {"per_stack": out, "ratios": ratios}


def fmt(ms: dict | None, digits: int = 1) -> str:
    if not ms:
        return "—"
    return f"{ms['median']:.{digits}f} [{ms['min']:.{digits}f}–{ms['max']:.{digits}f}]"


def report(results: dict) -> str:
    s = results["summary"]
    lines = [f"# The block path, step by step ({results['size']} size, {results['reps']} repetitions)", "",
             f"Command: `{results['command']}`  ", f"Machine: {results['machine']}  ",
             f"Load (/proc/loadavg) before and after: {results['loadavg_start']} / {results['loadavg_end']}", "",
             "Median [min–max] over the repetitions; ratios are taken per repetition against the baseline "
             "built in the same repetition, then their median [min–max].", "",
             "| step | fio write+fdatasync IOPS | its sync p99 ms | fio read IOPS (QD16) | read p99 ms | pgbench tps "
             "| tps vs ext4 | tps vs previous step | write IOPS vs ext4 | sync p99 vs previous |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for stack in STEPS:
        m = s["per_stack"].get(stack)
        if not m:
            continue
        rt = s["ratios"].get(stack, {})
        lines.append(
            f"| {stack} | {fmt(m['write_sync_iops'], 0)} | {fmt(m['write_sync_sync_p99_ms'], 2)} | "
            f"{fmt(m['read_iops'], 0)} | {fmt(m['read_p99_ms'], 2)} | {fmt(m['pgbench_tps'])} | "
            f"{fmt(rt.get('pgbench_tps_vs_ext4'), 2)} | {fmt(rt.get('pgbench_tps_vs_previous'), 2)} | "
            f"{fmt(rt.get('write_sync_iops_vs_ext4'), 2)} | {fmt(rt.get('write_sync_sync_p99_ms_vs_previous'), 2)} |")
    lines += ["", "CPU of the node process during a repetition (median s): the emulated drive's (what a "
              "hardware drive does) and the rest; and its stores' journals over the repetition (both stores "
              "summed; — for a build that does not report them): group commits, those that flushed the data "
              "device first, and page images carried in the log instead.", "",
              "| step | drive CPU s | host software CPU s | group commits | data flushes | carried images |",
              "|---|---|---|---|---|---|"]
    for stack in [st for st in STEPS if st not in ("ext4", "fuse-null")]:
        m = s["per_stack"].get(stack)
        if m:
            lines.append(f"| {stack} | {fmt(m['drive_cpu_seconds'], 2)} | {fmt(m['host_cpu_seconds'], 2)} | "
                         f"{fmt(m.get('journal_group_commits'), 0)} | {fmt(m.get('journal_data_flushes'), 0)} | "
                         f"{fmt(m.get('journal_carried_images'), 0)} |")
    lines += matrix_report(s)
    if results.get("rechoose"):
        lines += ["", "## Pages written while the host was busy, chosen again", "",
                  f"{results.get('rechoose_dataset', 'nycflights13:quick')} loaded into PostgreSQL with Algorithm 1 "
                  "told the host is always busy (every page "
                  "lz4 without a comparison); then pgbench -i and a pgbench run while the pass works (its cost); "
                  "then a wait for the pass to settle (at most the size's limit), a checkpoint and fstrim, and the "
                  "sizes. The data volume holds both the dataset and pgbench's tables at the end.", "",
                  "| stack | rep | data pages raw / lz4 / zstd after the load | at the end | software MiB at the end "
                  "| physical MiB at the end | pages stored anew | pgbench tps |", "|---|---|---|---|---|---|---|---|"]
        for r in results["rechoose"]:
            if "error" in r:
                lines.append(f"| {r['stack']} | {r['rep']} | error: {r['error'][:80]} |")
                continue

            def mix(st):
                c = st["compressed"]
                return f"{c['raw_pages']} / {c['lz4_pages']} / {c['zstd_pages']}"
            lines.append(
                f"| {r['stack']} | {r['rep']} | {mix(r['after_load'])} | {mix(r['settled'])} | "
                f"{r['settled']['compressed']['software_bytes'] / 2**20:.1f} | "
                f"{r['sizes']['physical_bytes'] / 2**20:.1f} | {r['settled']['rechoose']['rewritten_pages']} | "
                f"{r['pgbench']['tps']:.1f} |")
        ok = [r for r in results["rechoose"] if "error" not in r]
        for what, f in (("software MiB", lambda r: r["settled"]["compressed"]["software_bytes"] / 2**20),
                        ("physical MiB", lambda r: r["sizes"]["physical_bytes"] / 2**20),
                        ("pgbench tps", lambda r: r["pgbench"]["tps"])):
            per = {n: median_spread([f(r) for r in ok if r["stack"] == n]) for n in RECHOOSE_STACKS}
            ratio = median_spread([f(a) / f(b) for a in ok for b in ok if a["stack"] == RECHOOSE_STACKS[1]
                                   and b["stack"] == RECHOOSE_STACKS[0] and a["rep"] == b["rep"] and f(b)])
            lines.append(f"\n{what}: {RECHOOSE_STACKS[0]} {fmt(per[RECHOOSE_STACKS[0]])}, {RECHOOSE_STACKS[1]} "
                         f"{fmt(per[RECHOOSE_STACKS[1]])}; ratio per repetition {fmt(ratio, 3)}")
    return "\n".join(lines) + "\n"


def matrix_report(s: dict) -> list[str]:
    """The fio jobs by request size and queue depth: IOPS, the ratio to ext4 and to fuse-null
    (what the store costs on top of FUSE and the loop device), the serving processes' CPU per
    I/O."""
    present = [st for st in STEPS if st in s["per_stack"]
               and any((s["per_stack"][st].get(f"{j.replace('-', '_')}_iops") or {}) for j, _, _ in FIO_JOBS if j not in ("write-sync", "read"))]
    if not present:
        return []
    lines = ["", "## fio by request size and queue depth", "",
             "IOPS median [min–max]; `/ext4` and `/null` are per-repetition ratios to ext4 on a loop file and to "
             "fuse-null (the same FUSE export and loop device over a plain O_DIRECT file); CPU µs per I/O is the "
             "user plus system time of the serving processes (the node, or the null exports) over fio's I/Os "
             "(for write+fdatasync, per write and its fdatasync).", "",
             "| job | " + " | ".join(present) + " |", "|---" * (len(present) + 1) + "|"]
    for job, _, _ in FIO_JOBS:
        key = job.replace("-", "_")
        cells = []
        for st in present:
            m = s["per_stack"][st]
            rt = s["ratios"].get(st, {})
            cell = fmt(m.get(f"{key}_iops"), 0)
            extra = []
            if rt.get(f"{key}_iops_vs_ext4"):
                extra.append(f"/ext4 {rt[f'{key}_iops_vs_ext4']['median']:.2f}")
            if rt.get(f"{key}_iops_vs_fuse_null"):
                extra.append(f"/null {rt[f'{key}_iops_vs_fuse_null']['median']:.2f}")
            cpu = m.get(f"{key}_cpu_us_per_io")
            if cpu:
                extra.append(f"{cpu['median']:.0f} µs CPU")
            cells.append(cell + (" (" + ", ".join(extra) + ")" if extra else ""))
        lines.append(f"| {job} | " + " | ".join(cells) + " |")
    tps = [(st, s["ratios"].get(st, {}).get("pgbench_tps_vs_fuse_null")) for st in present]
    tps = [f"{st} {fmt(r, 2)}" for st, r in tps if r]
    if tps:
        lines += ["", "pgbench tps against fuse-null in the same repetition: " + "; ".join(tps) + "."]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench/block-path", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", dest="size", action="store_const", const="quick")
    g.add_argument("--full", dest="size", action="store_const", const="full")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=lambda x: x.split(","), default=STEPS)
    p.add_argument("--before-bin", metavar="PATH",
                   help="a tundra binary built before a change: steps named STEP@before use it")
    p.add_argument("--perf", action="store_true",
                   help="perf record -g the serving processes during some fio jobs (perf-JOB.txt in the logs)")
    p.add_argument("--rechoose", action="store_true", help="also the re-choice experiment")
    p.add_argument("--rechoose-dataset", default="nycflights13:quick", metavar="NAME[:SCALE]",
                   help="the dataset the re-choice experiment loads (default nycflights13:quick; "
                        "tpch:full is TPC-H at scale factor 1)")
    p.add_argument("--skip-steps", action="store_true", help="only the re-choice experiment")
    p.add_argument("--out", default=None)
    p.add_argument("--work-dir", default="/tmp")
    p.add_argument("--report-only", metavar="DIR", help="rewrite DIR/report.md from DIR/results.json")
    p.set_defaults(size="quick")
    a = p.parse_args(argv)
    if a.report_only:
        d = pathlib.Path(a.report_only)
        results = json.loads((d / "results.json").read_text())
        register_before_steps([r["stack"] for r in results["runs"]])
        results["summary"] = summarize(results["runs"])
        results.setdefault("loadavg_end", "not recorded")
        (d / "results.json").write_text(json.dumps(results, indent=1))
        (d / "report.md").write_text(report(results))
        print(report(results))
        return 0
    if os.geteuid() != 0:
        p.error("needs root")
    out = pathlib.Path(a.out or REPO / "target" / "bench" / "block-path" / time.strftime("%Y%m%dT%H%M%SZ",
                                                                                       time.gmtime()))
    out.mkdir(parents=True, exist_ok=True)
    bench = Bench(a, out)
    bench.tundra_bin.parent.mkdir(parents=True)
    subprocess.run(["cp", str(REPO / "target" / "release" / "tundra"), str(bench.tundra_bin)], check=True)
    if a.before_bin:
        subprocess.run(["cp", a.before_bin, str(bench.before_bin)], check=True)
    results = {"size": a.size, "reps": a.reps, "command": "bench/block-path " + " ".join(argv or sys.argv[1:]),
               "machine": f"{os.cpu_count()} CPUs, {os.uname().release}", "loadavg_start": loadavg(),
               "runs": [], "rechoose": [], "rechoose_dataset": ":".join(bench.rechoose_dataset)}
    if any(s.endswith("@before") for s in a.steps) and not a.before_bin:
        p.error("a STEP@before step needs --before-bin")
    register_before_steps(a.steps)
    steps = [] if a.skip_steps else [s for s in STEPS if s in a.steps]
    for rep in range(a.reps):
        order = steps[rep % len(steps):] + steps[:rep % len(steps)] if steps else []
        for name in order:
            r = bench.step_run(name, rep)
            r["rep"] = rep
            results["runs"].append(r)
            (out / "results.json").write_text(json.dumps(results, indent=1))
    if a.rechoose:
        for rep in range(a.reps):
            for name in RECHOOSE_STACKS:
                r = bench.rechoose_run(name, rep)
                r["rep"] = rep
                results["rechoose"].append(r)
                (out / "results.json").write_text(json.dumps(results, indent=1))
    results["loadavg_end"] = loadavg()
    results["summary"] = summarize(results["runs"])
    (out / "results.json").write_text(json.dumps(results, indent=1))
    (out / "report.md").write_text(report(results))
    subprocess.run(["rm", "-rf", "--one-file-system", str(bench.work)], check=False)
    print(report(results))
    log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
