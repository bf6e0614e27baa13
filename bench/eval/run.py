"""bench/run: regenerates Tundra's evaluation in one command (seed 000 §5, seed 004 §5).

For each database (PostgreSQL 15, MariaDB 10.11) and each system (a storage stack, plus for
MariaDB InnoDB's own compression on ext4), on a fresh stack every time:

  space       every dataset loaded, sizes after the load; then sustained updates with the sizes
              sampled over time (the decay of each system's ratio); sizes after the updates.
  throughput  the sysbench tables prepared (their sizes are the "sysbench" dataset of the space
              tables), then the seven workloads of seed 000 Figure 12, caches dropped before
              each, the database in a memory cgroup so that it reads from storage; sizes after.
Then the store alone on each dataset's PostgreSQL relation files (`scripts/datasets`, then
`tundra-bench store` and `tundra analyze`: seed 000 Figures 14, 5c and 2, Table 3), the drive
alone (`tundra-bench drive --suite latency`, Figure 7) and the report: results.json, report.md
and PNG plots in the output directory.

Every system is normalised to its uncompressed baseline measured in the same run: the
filesystems and InnoDB's compression to ext4, Tundra's configurations to Tundra with compression
off (and to ext4).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import platform
import shlex
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench.eval import common  # noqa: E402
from bench.eval.common import REPO, BenchError, log  # noqa: E402

DATABASES = ("postgresql", "mariadb")
DATASETS = ("tpch", "tpcds", "nycflights13", "wikipedia")
# Seed 000 Figure 12's workloads. Reads run before writes, inserts last, so the reads see the
# data as loaded and the table growth of inserts disturbs no other workload.
WORKLOADS = ("oltp_point_select", "oltp_read_only", "oltp_read_write", "oltp_write_only",
             "oltp_update_index", "oltp_update_non_index", "oltp_insert")


@dataclass(frozen=True)
class System:
    """One column of the evaluation: a storage stack, and what the database does on it."""
    name: str
    stack: str
    baseline: str                      # the uncompressed system it is normalised to
    table_options: str = ""            # appended to every CREATE TABLE (MariaDB)
    settings: dict = field(default_factory=dict)  # server options
    databases: tuple = DATABASES
    description: str = ""
    space: bool = True                 # loads the datasets (the ablation steps run sysbench only)


SYSTEMS = [
    System("ext4", "ext4", "ext4", description="ext4 on a loop image (uncompressed baseline)"),
    System("xfs", "xfs", "ext4", description="xfs on a loop image (uncompressed)"),
    System("btrfs-force", "btrfs-force", "ext4", description="btrfs compress-force=zstd:1"),
    System("btrfs-zstd", "btrfs-zstd", "ext4", description="btrfs compress=zstd (its heuristic may skip data)"),
    System("innodb-lz4", "ext4", "ext4", "PAGE_COMPRESSED=1", {"innodb_compression_algorithm": "lz4"},
           ("mariadb",), "InnoDB PAGE_COMPRESSED=1, lz4, on ext4"),
    System("innodb-zlib", "ext4", "ext4", "PAGE_COMPRESSED=1", {"innodb_compression_algorithm": "zlib"},
           ("mariadb",), "InnoDB PAGE_COMPRESSED=1, zlib, on ext4"),
    System("innodb-row-compressed", "ext4", "ext4", "ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8", {},
           ("mariadb",), "InnoDB ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8, on ext4"),
    System("tundra", "tundra", "tundra-off", description="Tundra: both layers, Algorithm 1, WAL on an uncompressed volume"),
    System("tundra-zstd", "tundra-zstd", "tundra-off", description="Tundra: both layers, zstd only"),
    System("tundra-lz4", "tundra-lz4", "tundra-off", description="Tundra: both layers, lz4 only"),
    System("tundra-drive-only", "tundra-drive-only", "tundra-off", description="Tundra: the drive compresses, software does not"),
    System("tundra-software-only", "tundra-software-only", "tundra-off", description="Tundra: software compresses (Algorithm 1), the drive does not"),
    System("tundra-off", "tundra-off", "tundra-off", description="Tundra with compression off (Tundra's uncompressed baseline)"),
    System("tundra-drive-inline", "tundra-drive-inline", "tundra-off",
           description="Tundra: both layers, the drive compressing in the writer's thread (deferred mode off)"),
    System("fuse-null", "fuse-null", "ext4", space=False,
           description="ablation: the block path with the store taken out (tundra-off's FUSE export, loop and ext4 over plain host files)"),
    System("tundra-drive-only-wal-on-data", "tundra-drive-only-wal-on-data", "tundra-off",
           description="ablation: drive only, WAL on the data volume", space=False),
    System("tundra-zstd-wal-on-data", "tundra-zstd-wal-on-data", "tundra-off",
           description="ablation: + software zstd, WAL on the data volume", space=False),
]
SYSTEM_BY_NAME = {s.name: s for s in SYSTEMS}
# Seed 000 Figure 13's steps, as far as they are built: each adds one thing to the one before.
ABLATION = (("tundra-drive-only-wal-on-data", "drive only"),
            ("tundra-zstd-wal-on-data", "+ software layer (zstd)"),
            ("tundra-zstd", "+ redo bypass (WAL on an uncompressed volume)"),
            ("tundra", "+ Algorithm 1"))


# A Tundra node's own cgroup is outside the database's budget; this ceiling only keeps a node
# gone wrong from taking the machine (its peak is reported).
NODE_MEMORY_CEILING = 2 << 30
# The longest one of the README's other benchmarks may take (pg-storage --full: about an hour).
EXTRA_SECONDS = 3 * 3600


@dataclass
class Size:
    """The knobs of one run size."""
    scale: str                 # scripts/datasets scale of the four datasets
    datasets: tuple
    update_seconds: float      # sustained updates per dataset
    sample_every: float
    sysbench_tables: int
    sysbench_rows: int
    workload_seconds: float
    threads: int
    memory_limit: str          # the database's memory budget, page cache and a Tundra node's caches included
    db_memory: str             # shared_buffers / innodb_buffer_pool_size
    stack_size: str            # each stack's logical size
    drive_bench: list
    systems: dict              # database -> system names
    repetitions: int = 1       # runs of each sysbench workload on a stack: tps is their median
    extras: bool = False       # also the README's other benchmarks (Runner.extras)


QUICK = Size(
    scale="quick", datasets=("tpch",), update_seconds=6, sample_every=3, sysbench_tables=2,
    sysbench_rows=10000, workload_seconds=3, threads=4, memory_limit="256MiB", db_memory="32MiB",
    stack_size="2GiB", drive_bench=["--quick"],
    systems={"postgresql": ["ext4", "xfs", "btrfs-force", "tundra", "tundra-off"],
             "mariadb": ["ext4", "innodb-lz4", "tundra", "tundra-off"]})
# The published size: every dataset (TPC-H and TPC-DS at the quick scale unless --scale full),
# every PostgreSQL system, MariaDB's peers and Tundra against its own baseline; about an hour on
# 2 cores.
FULL = Size(
    scale="quick", datasets=DATASETS, update_seconds=15, sample_every=5, sysbench_tables=6,
    sysbench_rows=100000, workload_seconds=8, threads=8, memory_limit="256MiB", db_memory="64MiB",
    stack_size="8GiB", drive_bench=["--size", "64MiB", "--reads", "2000"],
    systems={"postgresql": [s.name for s in SYSTEMS if "postgresql" in s.databases],
             "mariadb": ["ext4", "xfs", "btrfs-force", "btrfs-zstd", "innodb-lz4", "innodb-zlib",
                         "innodb-row-compressed", "tundra", "tundra-off"]},
    repetitions=3, extras=True)
# Tundra volumes take the database's page size, so that a page write is one store page.
PAGE_SIZE = {"postgresql": 8192, "mariadb": 16384}


def db_settings(database: str, size: Size, system: System) -> dict:
    memory = size.db_memory
    base = {"shared_buffers": memory} if database == "postgresql" else {"innodb_buffer_pool_size": memory}
    base.update(system.settings)
    return base


class Runner:
    def __init__(self, args, size: Size, out: pathlib.Path):
        self.args, self.size, self.out = args, size, out
        self.tundra_bin = pathlib.Path(args.tundra_bin) if args.tundra_bin else REPO / "target" / "release" / "tundra"
        self.bench_bin = REPO / "target" / "release" / "tundra-bench"
        self.work = pathlib.Path(args.work_dir or "/tmp") / f"tundra-bench.{os.getpid()}"
        self.results = {"space": [], "throughput": [], "store": [], "drive": None, "problems": []}
        self.ports = self._pick_ports()

    def _pick_ports(self) -> dict:
        chosen, port = {}, 21000 + os.getpid() % 2000 * 10
        for name in ("nbd", "native", "metrics", "db"):
            while not common.port_free(port):
                port += 1
            chosen[name] = port
            port += 1
        return chosen

    # --- one database on one fresh stack ---------------------------------------------------
    def with_stack(self, database: str, system: System, label: str, body):
        """Builds SYSTEM's stack, starts DATABASE on it in a memory cgroup, runs BODY(db, stack),
        and takes everything down again whatever happens. Returns BODY's result plus the checks."""
        from bench.eval.databases import make_database
        from bench.eval.stacks import make_stack
        tag = f"{database}.{system.name}.{label}"
        work = self.work / tag
        logs = self.out / "logs" / tag
        work.mkdir(parents=True)
        logs.mkdir(parents=True)
        cgroup = None
        children: list = []
        stack = None
        db = None
        result = {"database": database, "system": system.name, "stack": system.stack, "dataset": label}
        try:
            # The memory budget, made first. On a filesystem peer the database has all of it
            # (its page cache included). On Tundra the node's caches (stacks.NODE_CACHE: its
            # decompressed pages and its write-back bytes) come out of it: the database's
            # cgroup is limited to the budget less those bytes. The node itself runs in a
            # cgroup of its own, outside the budget, whose peak is reported beside it
            # (`memory.node`): a FUSE or NBD server charged against the same limit as the
            # filesystem it serves can enter reclaim, wait for the writeback of a dirty page
            # that only it can write, and stop for good (legacy memory cgroups wait on
            # writeback in reclaim); that is what a shared limit did to the node under MariaDB.
            from bench.eval.stacks import TUNDRA_SETTINGS, node_cache_bytes
            limit = common.parse_size(self.size.memory_limit)
            on_tundra = system.stack in TUNDRA_SETTINGS
            cache_bytes = node_cache_bytes() if on_tundra else 0
            if cache_bytes >= limit:
                raise BenchError(f"the node's caches ({common.mib(cache_bytes)}) leave nothing of {self.size.memory_limit}")
            cgroup = common.MemoryCgroup(f"{database}.{system.name}", limit)
            children = [common.MemoryCgroup("db", limit - cache_bytes, parent=cgroup)]
            if on_tundra:
                children.append(common.MemoryCgroup(f"{database}.{system.name}.node", NODE_MEMORY_CEILING))
                cgroup.companion = children[1]
            stack = make_stack(system.stack, work_dir=work / "stack",
                               size_bytes=common.parse_size(self.size.stack_size), tundra_bin=self.tundra_bin,
                               ports=self.ports, log_dir=logs, page_size=PAGE_SIZE[database],
                               node_cgroup=children[1] if on_tundra else None)
            stack.setup()
            db = make_database(database, name=tag, data_dir=stack.data_mount / "db",
                               wal_dir=stack.wal_mount / "wal", run_dir=work / "run", port=self.ports["db"],
                               cgroup=children[0], settings=db_settings(database, self.size, system), log_dir=logs)
            db.init()
            db.start()
            result.update(body(db, stack, cgroup))
            result["check"] = db.check()
            db.stop()
            result["versions"] = {**db.versions(), **stack.versions()}
        except BenchError as e:
            result["error"] = str(e)
            log(f"{tag}: FAILED: {e}")
        except Exception as e:  # a bug in the harness: keep the run going, report it
            result["error"] = f"{type(e).__name__}: {e}"
            log(f"{tag}: FAILED: {traceback.format_exc()}")
        finally:
            if db is not None:
                try:
                    db.stop()
                except BenchError as e:
                    log(f"{tag}: warning: stopping the database: {e}")
            try:
                if stack is not None:
                    stack.teardown()
                    result["post_check"] = stack.post_check()
            except BenchError as e:
                result.setdefault("error", str(e))
                log(f"{tag}: FAILED after the run: {e}")
            # A process the budget's OOM killer took shows up downstream as I/O errors or a
            # refused connection; name the cause instead.
            killed = [f"{c.path.name} ({c.oom_kills()} process(es))" for c in children if c.oom_kills()]
            if killed:
                message = (f"the memory budget's OOM killer killed processes in {', '.join(killed)} "
                           f"of {self.size.memory_limit}")
                log(f"{tag}: FAILED: {message}")
                result["error"] = message + (f"; then: {result['error']}" if "error" in result else "")
            for c in reversed(children):
                c.remove()
            if cgroup is not None:
                cgroup.remove()
            remove_tree(work)
        if "error" in result:
            self.results["problems"].append(f"{database} / {system.name} / {label}: {result['error']}")
        return result

    def measure(self, db, stack) -> dict:
        """Sizes now: the database's logical bytes and what the storage holds, after a checkpoint
        and fstrim, so both sides count the same state."""
        db.checkpoint()
        os.sync()
        stack.trim()
        logical = db.logical_bytes()
        sizes = stack.sizes()
        total_logical = logical["data"] + logical["wal"]
        return {"logical": logical, "logical_bytes": total_logical, **sizes,
                "ratio": total_logical / sizes["physical_bytes"] if sizes["physical_bytes"] else None,
                "data_ratio": (logical["data"] / sizes["data_physical_bytes"]
                               if sizes.get("data_physical_bytes") else None)}

    def sample(self, db, stack, started: float) -> dict:
        """A size sample during updates: no checkpoint, no trim (what the storage holds then)."""
        logical = db.logical_bytes()
        sizes = stack.sizes()
        total = logical["data"] + logical["wal"]
        return {"t": round(time.monotonic() - started, 1), "logical_bytes": total,
                "physical_bytes": sizes["physical_bytes"],
                "ratio": total / sizes["physical_bytes"] if sizes["physical_bytes"] else None,
                "load_average": os.getloadavg()[0]}

    def space(self, database: str, system: System, dataset: str) -> dict:
        size = self.size

        def body(db, stack, cgroup):
            cgroup.reset_peak()
            load = db.load_dataset(dataset, size.scale, system.table_options)
            after_load = self.measure(db, stack)
            log(f"{database}/{system.name}/{dataset}: loaded in {load['seconds']:.1f} s, "
                f"logical {common.mib(after_load['logical_bytes'])}, physical {common.mib(after_load['physical_bytes'])}")
            common.drop_caches()
            samples = []
            started = time.monotonic()
            updates = db.update_workload(dataset, size.update_seconds, size.threads, size.sample_every,
                                         lambda: samples.append(self.sample(db, stack, started)))
            after_updates = self.measure(db, stack)
            log(f"{database}/{system.name}/{dataset}: {updates.get('transactions')} update transactions, "
                f"ratio {fmt_ratio(after_load['ratio'])} -> {fmt_ratio(after_updates['ratio'])}")
            return {"dataset": dataset, "load": load, "after_load": after_load, "updates": updates,
                    "samples": samples, "after_updates": after_updates, "memory": cgroup.usage()}
        return self.with_stack(database, system, dataset, body)

    def throughput(self, database: str, system: System) -> dict:
        size = self.size

        def body(db, stack, cgroup):
            prep = db.sysbench_prepare(size.sysbench_tables, size.sysbench_rows, system.table_options)
            after_load = self.measure(db, stack)
            runs = {}
            for workload in self.workloads:
                repeated = []
                # Back to back, each after a checkpoint and with the kernel's caches dropped; a
                # workload's runs come before the next workload, so inserts still come last.
                for _ in range(size.repetitions):
                    db.checkpoint()
                    common.drop_caches()
                    cgroup.reset_peak()
                    r = db.sysbench_run(workload, size.workload_seconds, size.threads)
                    r["memory"] = cgroup.usage()
                    # The machine is shared: the 1-minute load average after the run says how
                    # busy it was (2 cores; sysbench, the database and the storage stack count too).
                    r["load_average"] = round(os.getloadavg()[0], 2)
                    repeated.append(r)
                    log(f"{database}/{system.name}: {workload}: {r['tps']:.1f} tps, p95 {r['p95_ms']} ms")
                runs[workload] = median_run(repeated)
            after = self.measure(db, stack)
            return {"dataset": "sysbench", "prepare": prep, "after_load": after_load, "workloads": runs,
                    "after_updates": after}
        return self.with_stack(database, system, "sysbench", body)

    def store(self, dataset: str) -> dict:
        """Seed 000 Figure 14, Table 3 and Figure 5c on the store alone: the dataset's PostgreSQL
        relation files (tables and indexes, from `scripts/datasets`) written page by page through
        the store onto an emulated drive, once per way of compressing, sizes from the store's and
        the drive's own usage (`tundra-bench store`); and what `tundra analyze` estimates for
        the same files, which must agree."""
        scale = self.size.scale
        logs = self.out / "logs" / "store"
        logs.mkdir(parents=True, exist_ok=True)
        result = {"dataset": dataset, "scale": scale}
        try:
            common.run([str(REPO / "scripts" / "datasets"), "--scale", scale, dataset],
                       what=f"scripts/datasets --scale {scale} {dataset}", log_file=logs / f"{dataset}-datasets.log")
            source = REPO / "target" / "datasets" / scale / dataset
            files = sorted(source.glob("*.heap")) + sorted(source.glob("*.index"))
            if not files:
                raise BenchError(f"scripts/datasets made no relation files in {source}")
            work = self.work / "store"
            work.mkdir(parents=True, exist_ok=True)
            names = [str(f) for f in files]
            measure = [str(self.bench_bin), "store", *names, "--page-size", "8KiB", "--json",
                       "--dir", str(work)]
            analyze = [str(self.tundra_bin), "analyze", *names, "--page-size", "8KiB", "--json"]
            started = time.monotonic()
            result["measure"] = json.loads(common.run(measure, what="tundra-bench store").stdout)
            result["analyze"] = json.loads(common.run(analyze, what="tundra analyze").stdout)
            result["seconds"] = round(time.monotonic() - started, 1)
            shown = f"target/datasets/{scale}/{dataset}/*.heap target/datasets/{scale}/{dataset}/*.index"
            result["commands"] = [f"scripts/datasets --scale {scale} {dataset}",
                                  f"tundra-bench store {shown} --page-size 8KiB --json",
                                  f"tundra analyze {shown} --page-size 8KiB --json"]
            for name, data in (("measure", result["measure"]), ("analyze", result["analyze"])):
                (logs / f"{dataset}-{name}.json").write_text(json.dumps(data, indent=1))
            adaptive = {layout["name"]: layout for layout in result["measure"]["layouts"]}.get("adaptive", {})
            log(f"store / {dataset}: drive only {fmt_ratio(result['measure'].get('drive_only_ratio'))}, "
                f"Algorithm 1 + drive {fmt_ratio(adaptive.get('ratio'))} ({result['seconds']} s)")
        except (BenchError, ValueError) as e:
            result["error"] = str(e)
            log(f"store / {dataset}: FAILED: {e}")
            self.results["problems"].append(f"store / {dataset}: {e}")
        return result

    def drive(self) -> dict | None:
        """Figure 7: the emulated drive's 16 KiB latency against a plain file, by compressibility."""
        out = self.out / "drive-bench.json"
        cmd = [str(self.bench_bin), "drive", "--suite", "latency", "--json", str(out),
               "--dir", str(self.work / "drive-bench"), *self.size.drive_bench]
        (self.work / "drive-bench").mkdir(parents=True, exist_ok=True)
        try:
            common.run(cmd, what="tundra-bench drive", log_file=self.out / "logs" / "drive-bench.log")
        except BenchError as e:
            self.results["problems"].append(f"drive bench: {e}")
            return None
        data = json.loads(out.read_text())
        data["command"] = shlex.join(cmd)
        return data

    def extras(self) -> list:
        """The README's other database and drive figures, each by the command that owns it,
        into a directory of this run: the drive against a plain file and its garbage collection
        (scripts/bench-drive), both layers on one real PostgreSQL table (scripts/bench-real-table),
        the block path step by step with the idle-host re-choice on TPC-H at scale factor 1
        (bench/block-path --full --rechoose --rechoose-dataset tpch:full), and PostgreSQL on TPC-H at scale factor 1 with pgbench (scripts/bench-pg-storage
        --full). Each one's failure is a problem of the run; the others still run."""
        steps = [
            ("drive", ["scripts/bench-drive", str(self.out / "drive"), "--", "--suite", "latency"], {"RUNS": "3"}),
            ("drive-gc", ["scripts/bench-drive", str(self.out / "drive-gc"), "--", "--suite", "gc"], {"RUNS": "1"}),
            ("real-table", ["scripts/bench-real-table", str(self.out / "real-table"), "3"], {}),
            ("block-path", ["bench/block-path", "--full", "--rechoose", "--rechoose-dataset", "tpch:full",
                            "--out", str(self.out / "block-path")], {}),
            ("pg-storage", ["scripts/bench-pg-storage", "--full"], {"PG_STORAGE_OUT": str(self.out / "pg-storage")}),
        ]
        done = []
        for name, cmd, env in steps:
            log(f"{name}: {shlex.join(cmd)}")
            started = time.monotonic()
            entry = {"name": name, "command": shlex.join(cmd), "env": env, "dir": name}
            try:
                common.run([str(REPO / cmd[0]), *cmd[1:]], what=name, log_file=self.out / "logs" / f"{name}.log",
                           env=env, timeout=EXTRA_SECONDS)
            except BenchError as e:
                entry["error"] = str(e)
                self.results["problems"].append(f"{name}: {e}")
            entry["seconds"] = round(time.monotonic() - started, 1)
            done.append(entry)
            self.results["extras"] = done
            self.save()
        return done

    def run(self) -> int:
        a = self.args
        self.workloads = a.workloads or WORKLOADS
        databases = a.databases or DATABASES
        datasets = a.datasets or self.size.datasets
        self.work.mkdir(parents=True)
        (self.out / "logs").mkdir(parents=True, exist_ok=True)
        meta = self.meta(databases, datasets)
        self.results["meta"] = meta
        self.save()
        log(f"output: {self.out}")
        for database in databases:
            names = a.systems or self.size.systems[database]
            systems = [SYSTEM_BY_NAME[n] for n in names if database in SYSTEM_BY_NAME[n].databases]
            for system in systems:
                if not a.skip_space and system.space:
                    for dataset in datasets:
                        log(f"{database} / {system.name} / {dataset}: space")
                        self.results["space"].append(self.space(database, system, dataset))
                        self.save()
                if not a.skip_throughput:
                    log(f"{database} / {system.name}: sysbench")
                    self.results["throughput"].append(self.throughput(database, system))
                    self.save()
        if not a.skip_store:
            for dataset in datasets:
                log(f"the store alone / {dataset} (Figure 14)")
                self.results["store"].append(self.store(dataset))
                self.save()
        if not a.skip_drive:
            log("the drive alone (Figure 7)")
            self.results["drive"] = self.drive()
        if self.size.extras and not a.skip_extras:
            self.results["extras"] = self.extras()
        self.results["meta"]["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.results["meta"]["wall_seconds"] = round(time.monotonic() - self.started, 1)
        self.save()
        from bench.eval.report import write_report
        report = write_report(self.results, self.out)
        remove_tree(self.work)
        log(f"report: {report}")
        failed = len(self.results["problems"])
        if failed:
            log(f"{failed} problem(s); see the report's Problems section")
        return 1 if failed else 0

    def save(self) -> None:
        tmp = self.out / "results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=1, default=str))
        tmp.replace(self.out / "results.json")

    def meta(self, databases, datasets) -> dict:
        self.started = time.monotonic()
        cpu = "unknown"
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = pathlib.Path("/proc/meminfo").read_text().split()[1]
        git = common.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], check=False).stdout.strip()
        dirty = common.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           check=False).stdout.strip()
        return {
            "command": "bench/run" + ("" if not sys.argv[1:] else " " + shlex.join(sys.argv[1:])),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "size": self.size.__dict__ | {"name": self.args.size},
            "databases": list(databases), "datasets": list(datasets), "workloads": list(self.workloads),
            "systems": {s.name: {"stack": s.stack, "baseline": s.baseline, "table_options": s.table_options,
                                 "settings": s.settings, "description": s.description} for s in SYSTEMS},
            "ablation": ABLATION,
            "machine": {"cpu": cpu, "nproc": os.cpu_count(), "ram_gib": round(int(mem) / 2**20, 1),
                        "kernel": platform.release(), "fuse_io_uring": fuse_io_uring()},
            "tundra": {"git": git, "dirty": bool(dirty)},
        }


def fuse_io_uring() -> bool:
    """Whether the kernel offers FUSE over io_uring (`/sys/module/fuse/parameters/enable_uring`):
    Tundra's mounts then take requests through it, else through /dev/fuse."""
    try:
        return pathlib.Path("/sys/module/fuse/parameters/enable_uring").read_text().strip() == "Y"
    except OSError:
        return False


def median_run(repeated: list) -> dict:
    """One workload's runs as one result: the run of median tps (its p95, memory and load),
    with every run's tps, p95 and load kept in `runs`."""
    ordered = sorted(repeated, key=lambda r: r["tps"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    median["tps"] = statistics.median(r["tps"] for r in repeated)
    median["runs"] = [{"tps": r["tps"], "p95_ms": r.get("p95_ms"), "load_average": r.get("load_average")}
                      for r in repeated]
    return median


def remove_tree(path: pathlib.Path) -> None:
    """Deletes a work directory, unless anything is still mounted under it (read from the mount
    table, which also lists a FUSE mount whose server died); then it is left and said so."""
    from bench.eval.stacks import mounts_under
    if not path.exists():
        return
    left = mounts_under(path)
    if left:
        log(f"warning: {path} is left in place: still mounted under it: {', '.join(left)}")
        return
    common.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def fmt_ratio(r) -> str:
    return "—" if r is None else f"{r:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="bench/run", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    group = p.add_mutually_exclusive_group()
    group.add_argument("--quick", dest="size", action="store_const", const="quick",
                       help="a few minutes: TPC-H at the quick scale, a subset of systems, 3 s workloads")
    group.add_argument("--full", dest="size", action="store_const", const="full",
                       help="the published size: every dataset (TPC-H and TPC-DS at sf 0.01 unless --scale full), "
                            "every PostgreSQL system, MariaDB's peers; about an hour")
    p.add_argument("--systems", type=lambda s: s.split(","), help="comma-separated system names (default: the size's)")
    p.add_argument("--databases", type=lambda s: s.split(","), help="postgresql,mariadb")
    p.add_argument("--datasets", type=lambda s: s.split(","), help=",".join(DATASETS))
    p.add_argument("--workloads", type=lambda s: s.split(","), help=",".join(WORKLOADS))
    p.add_argument("--scale", choices=("quick", "full"),
                   help="scripts/datasets scale of TPC-H and TPC-DS (quick: sf 0.01, full: sf 1)")
    p.add_argument("--update-seconds", type=float, help="sustained updates per dataset")
    p.add_argument("--workload-seconds", type=float, help="seconds per sysbench workload")
    p.add_argument("--repetitions", type=int,
                   help="runs of each sysbench workload (median and range reported; --quick 1, --full 3)")
    p.add_argument("--skip-space", action="store_true", help="no dataset loads")
    p.add_argument("--skip-throughput", action="store_true", help="no sysbench")
    p.add_argument("--skip-store", action="store_true",
                   help="no store measurement on the datasets' files (Figures 14, 5c, 2; Table 3)")
    p.add_argument("--skip-drive", action="store_true", help="no drive latency (Figure 7)")
    p.add_argument("--skip-extras", action="store_true",
                   help="with --full: not the README's other benchmarks (drive, real table, block path, pg-storage)")
    p.add_argument("--out", help="output directory (default target/bench/eval/<UTC time>)")
    p.add_argument("--work-dir", help="where stacks are built (default /tmp)")
    p.add_argument("--tundra-bin", help="the tundra binary the Tundra stacks run (default target/release/tundra; "
                                        "another build's, to measure a change against it)")
    p.add_argument("--list", action="store_true", help="list the systems and exit")
    p.set_defaults(size="quick")
    a = p.parse_args(argv)
    if a.list:
        for s in SYSTEMS:
            print(f"{s.name:32} {'/'.join(s.databases):20} {s.description}")
        return 0
    size = QUICK if a.size == "quick" else FULL
    size = Size(**size.__dict__)
    if a.update_seconds is not None:
        size.update_seconds = a.update_seconds
    if a.scale is not None:
        size.scale = a.scale
    if a.workload_seconds is not None:
        size.workload_seconds = a.workload_seconds
    if a.repetitions is not None:
        if a.repetitions < 1:
            p.error("--repetitions must be at least 1")
        size.repetitions = a.repetitions
    for name in a.systems or []:
        if name not in SYSTEM_BY_NAME:
            p.error(f"unknown system {name!r}; see --list")
    for d in a.databases or []:
        if d not in DATABASES:
            p.error(f"unknown database {d!r}: postgresql or mariadb")
    for d in a.datasets or []:
        if d not in DATASETS:
            p.error(f"unknown dataset {d!r}: {', '.join(DATASETS)}")
    for w in a.workloads or []:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}: {', '.join(WORKLOADS)}")
    if os.geteuid() != 0:
        p.error("needs root (loop devices, mounts, memory cgroups, drop_caches)")
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = pathlib.Path(a.out) if a.out else REPO / "target" / "bench" / "eval" / stamp
    out.mkdir(parents=True, exist_ok=True)
    runner = Runner(a, size, out)
    try:
        return runner.run()
    except BenchError as e:
        log(f"error: {e}")
        return 2
    finally:
        remove_tree(runner.work)


if __name__ == "__main__":
    sys.exit(main())
