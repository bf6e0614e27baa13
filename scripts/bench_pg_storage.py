#!/usr/bin/env python3
"""Helpers of scripts/bench-pg-storage (run with the project venv; see that script and
docs/bench-pg-storage.md for the usage and the exact definitions of every number).

Subcommands:
  prepare --scale S --cache DIR        the TPC-H CSV files and SQL (scripts/datasets.py prepare),
                                       cached in DIR/tpch-S; prints that directory
  meta --out FILE --set KEY=VALUE...   the configuration, the machine and the versions
  run --stack FILE --out FILE          one system: load, sizes, updates with size samples, sizes,
                                       checks; FILE is rewritten after every step
  fail --out FILE --system S --error M a system whose stack could not be set up
  report --dir DIR                     results.json and report.md from DIR/meta.json and
                                       DIR/systems/*.json; prints the report; exit 1 if a system
                                       failed or a number is missing
The bash driver sets the storage stacks up and tears them down; this file never mounts anything.
"""
from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import importlib.util
import json
import math
import os
import pathlib
import re
import shutil
import signal
import stat
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent
SYSTEMS = ("tundra", "tundra-off", "ext4", "btrfs")
CACHE_VERSION = 1
MIB = 1024 * 1024
T0 = float(os.environ.get("BENCH_T0") or time.time())


class Error(Exception):
    pass


def log(msg: str) -> None:
    s = int(time.time() - T0)
    print(f"bench-pg-storage: [{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}] {msg}",
          file=sys.stderr, flush=True)


def sh(cmd: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if check and p.returncode != 0:
        raise Error(f"{' '.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-2000:]}")
    return p


def write_json(path: pathlib.Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, allow_nan=True) + "\n")
    tmp.rename(path)


# --- prepare: the dataset, cached ------------------------------------------------------------


def load_datasets_module():
    spec = importlib.util.spec_from_file_location("tundra_datasets", HERE / "datasets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cmd_prepare(a) -> int:
    ds = load_datasets_module()
    cache = pathlib.Path(a.cache).resolve() / f"tpch-{a.scale}"
    want = {
        "cache_version": CACHE_VERSION,
        "dataset": "tpch",
        "scale": a.scale,
        "scale_factor": ds.SCALE_FACTORS[a.scale]["tpch"],
        "builder_version": ds.BUILDER_VERSION,
        "datasets_py_sha256": sha256(HERE / "datasets.py"),
        "versions": {d: ds.package_version(d) for d in ds.PACKAGES["tpch"]},
    }
    stamp = cache / "stamp.json"
    if stamp.is_file():
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = None
        files_ok = all((cache / f).is_file() for f in
                       ("schema.sql", "load.tsv", "indexes.sql", "checks.sql", "expected.json", "keys.json"))
        if have == want and files_ok and all(
                (cache / "csv" / pathlib.Path(line.split("\t")[1]).name).is_file()
                for line in (cache / "load.tsv").read_text().splitlines() if line.strip()):
            log(f"TPC-H {a.scale} (sf {want['scale_factor']}): cached in {cache}")
            print(cache)
            return 0
        log(f"{cache} is stale or incomplete: rebuilding")
    t0 = time.monotonic()
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.parent / f".{cache.name}.partial.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        ds.cmd_prepare(argparse.Namespace(dataset="tpch", scale=a.scale, work=str(partial)))
        # TPC-H order keys are sparse: dbgen's i-th order (i = 1..N) has key ((i >> 3) << 5) | (i & 7),
        # 8 used keys in every 32. The update workload draws i and computes the key, so check it.
        n = max_key = 0
        with open(partial / "csv" / "orders.csv", newline="") as f:
            for row in csv.reader(f):
                n += 1
                key = int(row[0])
                if key != ((n >> 3) << 5) | (n & 7):
                    raise Error(f"orders.csv row {n} has o_orderkey {key}, not dbgen's sparse key "
                                f"{((n >> 3) << 5) | (n & 7)}: the update workload's key formula is wrong")
                max_key = key
        write_json(partial / "keys.json", {"orders": n, "max_orderkey": max_key,
                                           "formula": "o_orderkey(i) = (i / 8) * 32 + i % 8, i = 1..orders"})
        write_json(partial / "stamp.json", want)
        if cache.exists():
            shutil.rmtree(cache)
        partial.rename(cache)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"TPC-H {a.scale} (sf {want['scale_factor']}): prepared in {time.monotonic() - t0:.1f} s into {cache}")
    print(cache)
    return 0


# --- meta: configuration, machine, versions --------------------------------------------------


def first_line(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, text=True, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return out[0].strip() if out else f"unavailable (exit {p.returncode})"


def cmd_meta(a) -> int:
    config = {}
    for kv in a.set or []:
        k, _, v = kv.partition("=")
        config[k] = v
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    for line in open("/proc/meminfo"):
        if line.startswith("MemTotal:"):
            mem_kib = int(line.split()[1])
    bindir = config.get("pg_bindir", "")
    git_head = first_line(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    status = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], text=True,
                            capture_output=True)
    dirty_files = [line for line in status.stdout.splitlines() if line.strip()]
    compsize = first_line(["dpkg-query", "-W", "-f", "${Version}", "btrfs-compsize"])
    meta = {
        "command": config.pop("command", ""),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": config,
        "machine": {
            "cpu_model": cpu,
            "nproc": os.cpu_count(),
            "ram_bytes": mem_kib * 1024,
            "kernel": os.uname().release,
            "kernel_version": os.uname().version,
        },
        "versions": {
            "postgresql": first_line([f"{bindir}/postgres", "--version"]),
            "pgbench": first_line([f"{bindir}/pgbench", "--version"]),
            "btrfs_progs": first_line(["mkfs.btrfs", "--version"]),
            "btrfs_compsize": compsize,
            "e2fsprogs": first_line(["mkfs.ext4", "-V"]),
            "util_linux": first_line(["losetup", "--version"]),
            "nbdfuse": first_line(["nbdfuse", "--version"]),
            "kernel": os.uname().release,
            "tundra_git": git_head,
            "tundra_dirty": bool(dirty_files),
            "tundra_dirty_files": len(dirty_files),
            "python": sys.version.split()[0],
        },
    }
    write_json(pathlib.Path(a.out), meta)
    return 0


# --- one system -------------------------------------------------------------------------------


class Pg:
    def __init__(self, st: dict):
        self.st = st

    def base(self, db: str) -> list[str]:
        st = self.st
        return [st["psql"], "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", st["host"], "-p", str(st["port"]),
                "-U", "postgres", "-d", db]

    def query(self, sql: str, db: str = "tpch") -> list[list[str]]:
        p = sh(self.base(db) + ["-A", "-t", "-F", "\t", "-c", sql])
        return [line.split("\t") for line in p.stdout.splitlines() if line != ""]

    def scalar(self, sql: str, db: str = "tpch") -> str:
        rows = self.query(sql, db)
        if len(rows) != 1 or len(rows[0]) != 1:
            raise Error(f"{sql!r} returned {rows!r}, expected one value")
        return rows[0][0]

    def run_file(self, path: pathlib.Path, db: str = "tpch") -> None:
        sh(self.base(db) + ["-f", str(path)])

    def copy(self, table: str, opts: str, path: pathlib.Path, db: str = "tpch") -> None:
        with open(path, "rb") as f:
            p = subprocess.run(self.base(db) + ["-c", f"COPY {table} FROM STDIN WITH ({opts})"],
                               stdin=f, capture_output=True, text=True)
        if p.returncode != 0:
            raise Error(f"COPY into {table} failed: {p.stderr.strip()[-2000:]}")


def drop_caches() -> None:
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


def logical_sizes(pgdata: str) -> dict:
    """Apparent bytes of the cluster's regular files; pg_wal (maybe a symlink to the WAL volume)
    separately."""
    data = wal = files = 0
    root = pathlib.Path(pgdata)
    for dirpath, _dirs, names in os.walk(root, followlinks=True):
        in_wal = pathlib.Path(dirpath) == root / "pg_wal" or (root / "pg_wal") in pathlib.Path(dirpath).parents
        for n in names:
            try:
                s = os.lstat(os.path.join(dirpath, n))
            except FileNotFoundError:
                continue  # removed while we walked (a recycled WAL segment, a temp file)
            if not stat.S_ISREG(s.st_mode):
                continue
            files += 1
            if in_wal:
                wal += s.st_size
            else:
                data += s.st_size
    return {"data_bytes": data, "wal_bytes": wal, "total_bytes": data + wal, "files": files}


def compsize(paths: list[str]) -> dict | None:
    p = subprocess.run(["compsize", "-b", *paths], text=True, capture_output=True)
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-500:]}
    out = {"types": {}}
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[1].endswith("%") and parts[2].isdigit():
            row = {"percent": float(parts[1][:-1]), "disk_bytes": int(parts[2]),
                   "uncompressed_bytes": int(parts[3]), "referenced_bytes": int(parts[4])}
            if parts[0] == "TOTAL":
                out.update(row)
            else:
                out["types"][parts[0]] = row
    if "disk_bytes" not in out:
        out["error"] = f"no TOTAL line in compsize's output: {p.stdout.strip()[-500:]}"
    return out


def btrfs_df(mount: str) -> dict:
    """`btrfs filesystem df -b`: total (allocated chunks) and used bytes per block group type."""
    sys.path.insert(0, str(REPO))
    from bench.eval.stacks import parse_btrfs_df  # the evaluation harness reads it the same way
    return parse_btrfs_df(subprocess.run(["btrfs", "filesystem", "df", "-b", mount], text=True, capture_output=True))


def fincore(path: str):
    p = subprocess.run(["fincore", "-b", "-n", "-o", "RES", path], text=True, capture_output=True)
    try:
        return int(p.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def tundra_stats(st: dict) -> dict:
    p = sh([st["tundra"], "stats", "--json", "--addr", st["tundra_addr"]])
    return json.loads(p.stdout)


def physical(st: dict, detail: bool) -> dict:
    kind = st["kind"]
    if kind in ("ext4", "btrfs"):
        out = {"image_allocated_bytes": allocated(st["image"]), "image_size_bytes": os.stat(st["image"]).st_size}
        out["total_bytes"] = out["image_allocated_bytes"]
        out["data_bytes"] = None  # one filesystem holds both: no split
        vfs = os.statvfs(st["mounts"][0])
        out["fs_used_bytes"] = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        if kind == "btrfs":
            cs = compsize([st["pgdata"]])
            out["compsize"] = cs
            if detail:
                out["compsize_wal"] = compsize([os.path.join(st["pgdata"], "pg_wal")])
                out["btrfs_df"] = btrfs_df(st["mounts"][0])
        return out
    s = tundra_stats(st)
    vols = {v["name"]: v for v in s["volumes"]}
    data, wal = vols["pgdata"], vols["pgwal"]
    out = {
        "data_bytes": data["physical_bytes_attributed"],
        "wal_bytes": wal["physical_bytes_attributed"],
        "total_bytes": data["physical_bytes_attributed"] + wal["physical_bytes_attributed"],
        "pgdata_device": data["device"],
        "pgdata_pages": data["pages"],
        "pgdata_logical_bytes": data["logical_bytes"],
        "pgdata_software_bytes": data["software_bytes"],
        "pgdata_compressed_bytes": data["compressed_bytes"],
        "pgdata_software_ratio": data["software_ratio"],
        "pgdata_mix": {k: data[k] for k in ("raw_pages", "lz4_pages", "zstd_pages", "heavy_pages")},
        "pgwal_pages": wal["pages"],
        "pgwal_logical_bytes": wal["logical_bytes"],
        "drive_mapped_bytes": s["drive"]["mapped_bytes"],
        "drive_physical_used_bytes": s["drive"]["physical_used_bytes"],
        "drive_gc_write_amplification": s["drive"]["gc_write_amplification"],
        "drive_gc_moved_bytes": s["drive"]["gc_moved_bytes"],
    }
    ddir = st["tundra_data_dir"]
    out["host_files_allocated_bytes"] = {n: allocated(os.path.join(ddir, n))
                                         for n in sorted(os.listdir(ddir)) if n.endswith(".img")}
    if detail:
        out["stats"] = s
    return out


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


class System:
    def __init__(self, st: dict, out: pathlib.Path):
        self.st = st
        self.out = out
        self.pg = Pg(st)
        self.name = st["system"]
        self.r = {"system": self.name, "kind": st["kind"], "status": "running", "stack": st,
                  "problems": []}
        self.dataset = pathlib.Path(st["dataset_dir"])
        self.keys = json.loads((self.dataset / "keys.json").read_text())
        self.work = pathlib.Path(st["work_dir"])

    def save(self) -> None:
        write_json(self.out, self.r)

    def problem(self, msg: str) -> None:
        log(f"{self.name}: PROBLEM: {msg}")
        self.r["problems"].append(msg)

    def cgroup(self, reset: bool = False) -> dict:
        cg = pathlib.Path(self.st["cgroup"])
        out = {}
        for f in ("usage_in_bytes", "max_usage_in_bytes", "limit_in_bytes", "failcnt"):
            try:
                out[f] = int((cg / f"memory.{f}").read_text())
            except (OSError, ValueError):
                pass
        try:
            stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
            out["stat"] = {k: int(stat[k]) for k in ("cache", "rss", "dirty", "writeback", "pgmajfault",
                                                      "total_pgmajfault") if k in stat}
        except (OSError, ValueError):
            pass
        if reset:
            for f in ("max_usage_in_bytes", "failcnt"):
                try:
                    (cg / f"memory.{f}").write_text("0\n")
                except OSError:
                    pass
        return out

    def check_cgroup(self) -> None:
        pid = self.st["postmaster_pid"]
        want = self.st["cgroup_rel"]
        got = None
        for line in open(f"/proc/{pid}/cgroup"):
            _, ctl, path = line.rstrip("\n").split(":", 2)
            if "memory" in ctl.split(","):
                got = path
        self.r["postmaster_cgroup"] = got
        if got != want:
            raise Error(f"the postmaster ({pid}) is in memory cgroup {got!r}, not {want!r}")

    def measure(self, label: str) -> dict:
        """CHECKPOINT, sync, fstrim of every mounted filesystem, then the sizes."""
        t0 = time.monotonic()
        self.pg.query("CHECKPOINT", db="postgres")
        os.sync()
        trimmed = {}
        for m in self.st["mounts"]:
            p = sh(["fstrim", "-v", m])
            mm = re.search(r"\((\d+) bytes\)", p.stdout)
            trimmed[m] = int(mm.group(1)) if mm else None
        os.sync()
        lg = logical_sizes(self.st["pgdata"])
        ph = physical(self.st, detail=True)
        if self.st["kind"] == "tundra":
            # nbdfuse serves its file with FUSE direct_io: the host page cache should hold none
            # of it, with or without loop direct I/O. Recorded as evidence.
            ph["fuse_file_cached_bytes"] = {lp["name"]: fincore(lp["backing"]) for lp in self.st["loops"]}
        m = {"label": label, "logical": lg, "physical": ph, "fstrim_bytes": trimmed,
             "ratio": ratio(lg["total_bytes"], ph["total_bytes"]),
             "data_ratio": ratio(lg["data_bytes"], ph.get("data_bytes")),
             "seconds": time.monotonic() - t0}
        if self.st["kind"] == "btrfs" and ph.get("compsize") and "disk_bytes" in ph["compsize"]:
            m["compsize_ratio"] = ratio(ph["compsize"]["uncompressed_bytes"], ph["compsize"]["disk_bytes"])
        log(f"{self.name}: {label}: logical {lg['total_bytes'] / MIB:.1f} MiB (WAL {lg['wal_bytes'] / MIB:.1f}),"
            f" physical {ph['total_bytes'] / MIB:.1f} MiB, ratio {fmt(m['ratio'], 2)}")
        return m

    def sample(self, t: float) -> dict:
        lg = logical_sizes(self.st["pgdata"])
        ph = physical(self.st, detail=False)
        s = {"t": round(t, 1), "loadavg1": float(open("/proc/loadavg").read().split()[0]),
             "logical_bytes": lg["total_bytes"], "logical_wal_bytes": lg["wal_bytes"],
             "physical_bytes": ph["total_bytes"], "ratio": ratio(lg["total_bytes"], ph["total_bytes"])}
        if ph.get("data_bytes") is not None:
            s["physical_data_bytes"] = ph["data_bytes"]
        if "compsize" in ph and ph["compsize"] and "disk_bytes" in ph["compsize"]:
            s["compsize_disk_bytes"] = ph["compsize"]["disk_bytes"]
            s["compsize_uncompressed_bytes"] = ph["compsize"]["uncompressed_bytes"]
        return s

    # --- steps ---

    def load(self) -> None:
        st = self.st
        steps = {}
        lines = [line.split("\t") for line in (self.dataset / "load.tsv").read_text().splitlines() if line.strip()]
        drop_caches()
        log(f"{self.name}: loading TPC-H {st['scale']} ({len(lines)} tables)")
        t0 = time.monotonic()
        self.pg.run_file(self.dataset / "schema.sql")
        steps["create_tables"] = time.monotonic() - t0
        t = time.monotonic()
        per_table = {}
        for table, path, opts in lines:
            t1 = time.monotonic()
            self.pg.copy(table, opts, self.dataset / "csv" / pathlib.Path(path).name)
            per_table[table] = time.monotonic() - t1
        steps["copy"] = time.monotonic() - t
        steps["copy_per_table"] = per_table
        t = time.monotonic()
        self.pg.run_file(self.dataset / "indexes.sql")
        steps["keys"] = time.monotonic() - t
        t = time.monotonic()
        # As scripts/datasets: CHECKPOINT first (hint bits need the commit LSNs flushed), then
        # VACUUM and ANALYZE, then CHECKPOINT.
        sh(self.pg.base("tpch") + ["-c", "CHECKPOINT", "-c", "VACUUM", "-c", "ANALYZE", "-c", "CHECKPOINT"])
        steps["vacuum_analyze_checkpoint"] = time.monotonic() - t
        total = time.monotonic() - t0
        self.r["load"] = {"seconds": total, "steps": steps}
        log(f"{self.name}: loaded in {total:.1f} s (COPY {steps['copy']:.1f}, keys {steps['keys']:.1f},"
            f" VACUUM/ANALYZE/CHECKPOINT {steps['vacuum_analyze_checkpoint']:.1f})")

    def check_load(self) -> None:
        t0 = time.monotonic()
        expected = json.loads((self.dataset / "expected.json").read_text())
        got = {row[0]: [int(v) for v in row[1:]] for row in self.pg.query((self.dataset / "checks.sql").read_text())}
        bad = {t: {"expected": e, "got": got.get(t)} for t, e in expected.items() if got.get(t) != e}
        n, mx = self.pg.query("SELECT count(*), max(o_orderkey) FROM orders")[0]
        keys_ok = int(n) == self.keys["orders"] and int(mx) == self.keys["max_orderkey"]
        self.r["load_check"] = {"tables": len(expected), "mismatches": bad, "orders": int(n),
                                "max_orderkey": int(mx), "keys_ok": keys_ok, "seconds": time.monotonic() - t0}
        if bad:
            self.problem(f"after the load, [rows, non-NULL values, '' values] differ from the source: {bad}")
        if not keys_ok:
            self.problem(f"orders has {n} rows and max key {mx}, the CSV {self.keys}")
        if not bad and keys_ok:
            log(f"{self.name}: load checked: every table's rows, non-NULL and '' counts match the source")

    def update_script(self) -> pathlib.Path:
        sql = """
CREATE TABLE bench_history (h_orderkey bigint NOT NULL, h_linenumber int NOT NULL,
  h_cents int NOT NULL, h_time timestamptz NOT NULL, h_note text NOT NULL);
CREATE TABLE bench_vocab (ws text[] NOT NULL);
INSERT INTO bench_vocab SELECT array_agg(DISTINCT w ORDER BY w) FROM (
  SELECT regexp_split_to_table(o_comment, ' +') AS w
  FROM (SELECT o_comment FROM orders ORDER BY o_orderkey LIMIT 20000) o) s WHERE w <> '';
CREATE FUNCTION bench_text(n int) RETURNS text LANGUAGE sql VOLATILE AS $$
  SELECT left(string_agg(v.ws[1 + floor(random() * cardinality(v.ws))::int], ' '), n)
  FROM bench_vocab v, generate_series(1, 1 + n / 4) $$;
"""
        f = self.work / "update-setup.sql"
        f.write_text(sql)
        self.pg.run_file(f)
        self.pg.query("CHECKPOINT")
        self.r["update_vocabulary_words"] = int(self.pg.scalar("SELECT cardinality(ws) FROM bench_vocab"))
        script = self.work / "update.pgbench"
        script.write_text(UPDATE_SCRIPT)
        self.r["update_script"] = UPDATE_SCRIPT
        self.r["update_setup_sql"] = sql
        return script

    def updates(self) -> None:
        st = self.st
        script = self.update_script()
        seconds, interval = int(st["update_seconds"]), int(st["sample_interval"])
        prefix = self.work / "pgbench_log"
        for old in glob.glob(f"{prefix}*"):
            os.unlink(old)
        cmd = [st["pgbench"], "-n", "-f", str(script), "-c", str(st["clients"]), "-j", str(st["threads"]),
               "-T", str(seconds), "-P", str(interval), "-l", f"--log-prefix={prefix}",
               "-D", f"norders={self.keys['orders']}",
               "-h", st["host"], "-p", str(st["port"]), "-U", "postgres", "tpch"]
        self.r["update_command"] = " ".join(cmd)
        drop_caches()
        samples = [self.sample(0.0)]
        out_f = open(self.work / "pgbench.out", "w")
        err_f = open(self.work / "pgbench.err", "w")
        log(f"{self.name}: updates for {seconds} s ({st['clients']} clients, {st['threads']} threads),"
            f" sizes every {interval} s")
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out_f, stderr=err_f, cwd=self.work)
        try:
            k = 1
            while True:
                nxt = t0 + k * interval
                while proc.poll() is None and time.monotonic() < nxt:
                    time.sleep(min(0.2, max(0.0, nxt - time.monotonic())))
                if proc.poll() is not None:
                    break
                s = self.sample(time.monotonic() - t0)
                samples.append(s)
                if interval >= 30 or k % max(1, 30 // interval) == 0:
                    log(f"{self.name}: updates t={s['t']:.0f} s: physical {s['physical_bytes'] / MIB:.1f} MiB,"
                        f" logical {s['logical_bytes'] / MIB:.1f} MiB")
                k += 1
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            out_f.close()
            err_f.close()
        elapsed = time.monotonic() - t0
        samples.append(self.sample(elapsed))
        self.r["samples"] = samples
        out = (self.work / "pgbench.out").read_text()
        err = (self.work / "pgbench.err").read_text()
        self.r["pgbench_stdout"] = out
        self.r["pgbench_stderr_tail"] = err[-4000:]
        if rc != 0:
            raise Error(f"pgbench exited {rc}: {err.strip()[-1500:]}")
        u = parse_pgbench(out, err)
        u.update(latencies(glob.glob(f"{prefix}*")))
        u["seconds"] = elapsed
        self.r["update"] = u
        log(f"{self.name}: updates done: {fmt(u.get('tps'), 1)} tps, latency avg {fmt(u.get('latency_avg_ms'), 2)} ms,"
            f" p95 {fmt(u.get('latency_p95_ms'), 2)} ms, {u.get('transactions')} transactions,"
            f" {u.get('failed', 0)} failed")
        for f in glob.glob(f"{prefix}*"):
            os.unlink(f)

    def check_updates(self) -> None:
        u = self.r["update"]
        hist = int(self.pg.scalar("SELECT count(*) FROM bench_history"))
        self.r["update_check"] = {"history_rows": hist, "transactions": u.get("transactions"),
                                  "logged_transactions": u.get("logged_transactions")}
        if hist != u.get("transactions"):
            self.problem(f"bench_history has {hist} rows but pgbench committed {u.get('transactions')} transactions")
        n = int(self.pg.scalar("SELECT count(*) FROM orders"))
        if n != self.keys["orders"]:
            self.problem(f"orders has {n} rows after the updates, not {self.keys['orders']}")
        if not self.st.get("amcheck", True):
            return
        drop_caches()
        t0 = time.monotonic()
        p = subprocess.run([self.st["pg_amcheck"], "-h", self.st["host"], "-p", str(self.st["port"]),
                            "-U", "postgres", "--install-missing", "tpch"], text=True, capture_output=True)
        self.r["amcheck"] = {"exit": p.returncode, "seconds": time.monotonic() - t0,
                             "output": (p.stdout + p.stderr)[-4000:]}
        if p.returncode != 0:
            self.problem(f"pg_amcheck exited {p.returncode}: {(p.stdout + p.stderr).strip()[-1500:]}")
        else:
            log(f"{self.name}: pg_amcheck (heap and B-tree) clean in {time.monotonic() - t0:.1f} s")

    def run(self) -> None:
        st = self.st
        self.check_cgroup()
        self.pg.query("CREATE DATABASE tpch", db="postgres")
        self.r["settings"] = {row[0]: row[1] for row in self.pg.query(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings WHERE name IN "
            "('shared_buffers', 'max_wal_size', 'min_wal_size', 'checkpoint_timeout', 'full_page_writes',"
            " 'synchronous_commit', 'fsync', 'wal_level', 'autovacuum', 'effective_cache_size', 'work_mem',"
            " 'maintenance_work_mem', 'wal_compression', 'server_version') ORDER BY name")}
        self.r["sizes"] = {"initial": self.measure("initial (after initdb)")}
        self.save()
        self.r["memory_cgroup"] = {"before_load": self.cgroup(reset=True)}
        self.load()
        self.r["memory_cgroup"]["load"] = self.cgroup(reset=False)
        self.save()
        self.r["sizes"]["after_load"] = self.measure("after load")
        self.save()
        self.check_load()
        self.save()
        self.cgroup(reset=True)
        self.updates()
        self.r["memory_cgroup"]["updates"] = self.cgroup(reset=False)
        self.save()
        self.r["sizes"]["after_updates"] = self.measure(f"after {st['update_seconds']} s of updates")
        self.save()
        self.check_updates()
        self.r["status"] = "ok" if not self.r["problems"] else "problems"


UPDATE_SCRIPT = r"""-- scripts/bench-pg-storage: one transaction of the update workload (same for every system).
-- :norders is the number of orders; TPC-H's i-th order has key (i / 8) * 32 + i % 8.
\set i random(1, :norders)
\set ok (:i / 8) * 32 + :i % 8
\set ln random(1, 7)
\set qty random(1, 50)
\set cents random(-10000, 10000)
BEGIN;
SELECT o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate, o_orderpriority, o_clerk, o_comment FROM orders WHERE o_orderkey = :ok;
SELECT l_linenumber, l_partkey, l_suppkey, l_quantity, l_extendedprice, l_discount, l_shipdate, l_comment FROM lineitem WHERE l_orderkey = :ok;
UPDATE orders SET o_totalprice = o_totalprice + :cents * 0.01, o_comment = bench_text(length(o_comment)) WHERE o_orderkey = :ok;
UPDATE lineitem SET l_quantity = :qty, l_comment = bench_text(length(l_comment)) WHERE l_orderkey = :ok AND l_linenumber = LEAST(:ln, (SELECT max(l_linenumber) FROM lineitem WHERE l_orderkey = :ok));
INSERT INTO bench_history (h_orderkey, h_linenumber, h_cents, h_time, h_note) VALUES (:ok, :ln, :cents, now(), bench_text(30));
END;
"""


def parse_pgbench(out: str, err: str) -> dict:
    u = {}
    pats = {
        "transactions": r"number of transactions actually processed: (\d+)",
        "failed": r"number of failed transactions: (\d+)",
        "latency_avg_ms_pgbench": r"latency average = ([\d.]+) ms",
        "latency_stddev_ms_pgbench": r"latency stddev = ([\d.]+) ms",
        "initial_connection_ms": r"initial connection time = ([\d.]+) ms",
        "tps": r"tps = ([\d.]+) \(without initial connection time\)",
    }
    for k, pat in pats.items():
        m = re.search(pat, out)
        if m:
            u[k] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
    prog = []
    for m in re.finditer(r"progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms stddev ([\d.NaN]+)", err):
        prog.append({"t": float(m.group(1)), "tps": float(m.group(2)), "latency_ms": float(m.group(3))})
    u["progress"] = prog
    return u


def percentile(sorted_values: list[int], p: float) -> float:
    """Nearest rank: the smallest value with at least p of the values at or below it."""
    if not sorted_values:
        return float("nan")
    k = max(1, math.ceil(p * len(sorted_values)))
    return float(sorted_values[k - 1])


def latencies(files: list[str]) -> dict:
    """pgbench -l lines: client_id transaction_no time script_no time_epoch time_us; time in µs,
    or 'failed'/'skipped'."""
    lat = []
    failed = 0
    for f in files:
        with open(f) as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 6:
                    continue
                if parts[2].isdigit():
                    lat.append(int(parts[2]))
                else:
                    failed += 1
    lat.sort()
    n = len(lat)
    return {
        "logged_transactions": n,
        "logged_failed": failed,
        "latency_avg_ms": (sum(lat) / n / 1000.0) if n else float("nan"),
        "latency_p50_ms": percentile(lat, 0.50) / 1000.0,
        "latency_p95_ms": percentile(lat, 0.95) / 1000.0,
        "latency_p99_ms": percentile(lat, 0.99) / 1000.0,
        "latency_max_ms": (lat[-1] / 1000.0) if n else float("nan"),
    }


def cmd_run(a) -> int:
    st = json.loads(pathlib.Path(a.stack).read_text())
    out = pathlib.Path(a.out)
    s = System(st, out)

    def on_term(signum, _frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        s.run()
        s.save()
        return 0
    except (Error, OSError, ValueError, KeyError, subprocess.SubprocessError) as e:
        s.r["status"] = "failed"
        s.r["error"] = f"{type(e).__name__}: {e}"
        log(f"{s.name}: FAILED: {s.r['error']}")
        s.save()
        return 1
    except SystemExit:
        s.r["status"] = "failed"
        s.r["error"] = "interrupted"
        s.save()
        raise


def cmd_fail(a) -> int:
    write_json(pathlib.Path(a.out), {"system": a.system, "status": "failed", "error": a.error, "problems": []})
    return 0


# --- report -----------------------------------------------------------------------------------


def fmt(v, digits: int = 2, suffix: str = "") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    return f"{v:,.{digits}f}{suffix}"


def mib(v) -> str:
    return fmt(None if v is None else v / MIB, 1)


def get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def required_numbers(r: dict) -> dict:
    req = {
        "load seconds": get(r, "load", "seconds"),
        "logical after load": get(r, "sizes", "after_load", "logical", "total_bytes"),
        "physical after load": get(r, "sizes", "after_load", "physical", "total_bytes"),
        "ratio after load": get(r, "sizes", "after_load", "ratio"),
        "tps": get(r, "update", "tps"),
        "latency avg": get(r, "update", "latency_avg_ms"),
        "latency p95": get(r, "update", "latency_p95_ms"),
        "logical after updates": get(r, "sizes", "after_updates", "logical", "total_bytes"),
        "physical after updates": get(r, "sizes", "after_updates", "physical", "total_bytes"),
        "ratio after updates": get(r, "sizes", "after_updates", "ratio"),
    }
    if r.get("kind") == "tundra":
        req["data-only physical after load"] = get(r, "sizes", "after_load", "physical", "data_bytes")
        req["data-only physical after updates"] = get(r, "sizes", "after_updates", "physical", "data_bytes")
    if r.get("kind") == "btrfs":
        req["compsize disk after load"] = get(r, "sizes", "after_load", "physical", "compsize", "disk_bytes")
        req["compsize disk after updates"] = get(r, "sizes", "after_updates", "physical", "compsize", "disk_bytes")
    return req


LOG_PATTERNS = {
    "tundra.log": re.compile(r"error|fail|panic|warn|corrupt|refus", re.I),
    "postgresql.log": re.compile(r"\b(ERROR|FATAL|PANIC|WARNING)\b"),
    "nbdfuse": re.compile(r".+"),
    "pg-on-tundra.log": re.compile(r"error|warning", re.I),
}


# Log lines that are normal operation, not problems: autovacuum gives way to a conflicting lock
# (the load's ALTER TABLE / VACUUM).
BENIGN = ("canceling autovacuum task", "automatic vacuum of table", "automatic analyze of table")


def scan_logs(logdir: pathlib.Path) -> list[str]:
    found = []
    if not logdir.is_dir():
        return found
    for f in sorted(logdir.iterdir()):
        pat = None
        for key, p in LOG_PATTERNS.items():
            if f.name == key or f.name.startswith(key):
                pat = p
        if pat is None:
            continue
        hits = [line.rstrip() for line in f.read_text(errors="replace").splitlines()
                if pat.search(line) and not any(b in line for b in BENIGN)]
        if hits:
            uniq = []
            for h in hits:
                if h not in uniq:
                    uniq.append(h)
            found.append(f"{f.name}: {len(hits)} line(s), e.g. " + " | ".join(uniq[:4])[:800])
    return found


def cmd_report(a) -> int:
    d = pathlib.Path(a.dir)
    meta = json.loads((d / "meta.json").read_text())
    cfg = meta["config"]
    order = [s for s in SYSTEMS if s in cfg.get("systems", "").split(",")]
    res = {}
    for s in order:
        f = d / "systems" / f"{s}.json"
        res[s] = json.loads(f.read_text()) if f.is_file() else {"system": s, "status": "failed",
                                                                 "error": "no result file", "problems": []}
    problems = []
    missing = {}
    for s, r in res.items():
        if r.get("status") == "failed":
            problems.append(f"{s}: FAILED: {r.get('error')}")
        for p in r.get("problems", []):
            problems.append(f"{s}: {p}")
        miss = [k for k, v in required_numbers(r).items() if not finite(v)]
        if miss:
            missing[s] = miss
            if r.get("status") != "failed":
                problems.append(f"{s}: numbers missing or not finite: {', '.join(miss)}")
        if r.get("kind") == "tundra" or s in ("tundra", "tundra-off"):
            rc_file = d / "logs" / s / "tundra-fsck.rc"
            if rc_file.is_file():
                rc = int(rc_file.read_text().strip() or -1)
                r["tundra_fsck"] = {"exit": rc, "output_tail": (d / "logs" / s / "tundra-fsck.txt").read_text(
                    errors="replace")[-3000:]}
                if rc != 0:
                    bad = len(re.findall("fails its checksum", (d / "logs" / s / "tundra-fsck.txt").read_text(errors="replace")))
                    r.setdefault("problems", []).append(
                        f"tundra fsck after the run exited {rc}: {bad} page(s) fail their checksum "
                        f"(logs/{s}/tundra-fsck.txt)")
                    problems.append(f"{s}: {r['problems'][-1]}")
            elif r.get("status") != "failed":
                r.setdefault("problems", []).append("no tundra fsck result")
                problems.append(f"{s}: no tundra fsck result")
        for line in scan_logs(d / "logs" / s):
            problems.append(f"{s}: log: {line}")
        for lp in (r.get("stack") or {}).get("loops", []):
            if lp.get("dio_requested") and not lp.get("dio"):
                problems.append(f"{s}: direct I/O refused on {lp['dev']} ({lp['name']}, backed by "
                                f"{lp['backing']}): {lp.get('dio_error') or 'the loop device reports dio=0'}")
    dm = d / "dmesg-new.txt"
    if dm.is_file():
        pat = re.compile(r"error|warn|fail|hung|blocked for more|oom|killed process|call trace", re.I)
        hits = [line for line in dm.read_text(errors="replace").splitlines() if pat.search(line)]
        if hits:
            problems.append(f"kernel log: {len(hits)} line(s), e.g. " + " | ".join(hits[:5])[:800])

    results = {"meta": meta, "systems": res, "problems": problems, "missing_numbers": missing}
    write_json(d / "results.json", results)
    md = render(meta, res, problems)
    (d / "report.md").write_text(md)
    print(md)
    failed = [s for s, r in res.items() if r.get("status") == "failed"]
    bad_data = any(r.get("problems") for r in res.values())
    return 1 if failed or missing or bad_data else 0


def render(meta: dict, res: dict, problems: list[str]) -> str:
    cfg = meta["config"]
    m, v = meta["machine"], meta["versions"]
    L = []
    sf = cfg.get("scale_factor")
    L.append(f"# PostgreSQL storage benchmark: TPC-H sf {sf}, {cfg.get('update_seconds')} s of updates")
    L.append("")
    L.append(f"Command: `{meta['command']}`  ")
    L.append(f"Date: {meta['date_utc']}, wall time {fmt(float(cfg['wall_seconds']) if cfg.get('wall_seconds') else None, 0)} s  ")
    L.append("Definitions: docs/bench-pg-storage.md. Every raw number: results.json beside this file.")
    L.append("")
    L.append("## Configuration")
    L.append("")
    dio = []
    for s, r in res.items():
        for lp in r.get("stack", {}).get("loops", []):
            dio.append(f"{s}/{lp['name']} {'on' if lp.get('dio') else 'OFF'}")
    L.append(f"- dataset: TPC-H sf {sf} ({cfg.get('scale')}) from scripts/datasets.py (DuckDB dbgen), "
             f"cached in {cfg.get('dataset_dir')}")
    L.append(f"- systems: {', '.join(res)}")
    L.append(f"- updates: pgbench -n -c {cfg.get('clients')} -j {cfg.get('threads')} -T {cfg.get('update_seconds')}, "
             f"sizes sampled every {cfg.get('sample_interval')} s")
    L.append(f"- PostgreSQL: shared_buffers {cfg.get('shared_buffers')}, other settings default; postmaster in a "
             f"memory cgroup limited to {cfg.get('cgroup_limit')} (page cache included); caches dropped between phases")
    L.append(f"- loop devices, direct I/O: {', '.join(dio) or '—'}")
    if cfg.get("tundra_direct_io") == "0" and any(s.startswith("tundra") for s in res):
        cached = [f"{s}/{k} {v}" for s, r in res.items() for label in ("after_load", "after_updates")
                  for k, v in (get(r, "sizes", label, "physical", "fuse_file_cached_bytes") or {}).items()]
        L.append("  - Tundra's loop devices (over nbdfuse's files) run without direct I/O (--no-tundra-direct-io), "
                 "as scripts/pg-on-tundra makes them. nbdfuse serves its file with FUSE direct_io, so the host "
                 "page cache holds none of the volumes either way (fincore, bytes cached: "
                 f"{', '.join(cached) or '—'}).")
    L.append(f"- sizes: ext4/btrfs loop image {cfg.get('image_size')}; Tundra DATA_SIZE {cfg.get('tundra_data_size')}, "
             f"WAL_SIZE {cfg.get('tundra_wal_size')}, DRIVE_PHYSICAL {cfg.get('tundra_drive_physical')}, "
             f"FAST_VOLUMES {cfg.get('tundra_fast_volumes')}")
    L.append("")
    L.append("## Machine and versions")
    L.append("")
    L.append(f"- CPU: {m['cpu_model']}, nproc {m['nproc']}, RAM {m['ram_bytes'] / 2**30:.1f} GiB, kernel {m['kernel']}")
    L.append(f"- {v['postgresql']}; {v['btrfs_progs']}; compsize {v['btrfs_compsize']}; {v['e2fsprogs']}; "
             f"{v['nbdfuse']}; {v['util_linux']}")
    L.append(f"- tundra {v['tundra_git']}{' (dirty: ' + str(v['tundra_dirty_files']) + ' files changed)' if v['tundra_dirty'] else ' (clean)'}")
    L.append("")

    ext4 = res.get("ext4", {})
    off = res.get("tundra-off", {})

    def rel(r, base, *path):
        return ratio(get(r, *path), get(base, *path))

    L.append("## After loading")
    L.append("")
    L.append("| system | status | load s | load vs ext4 | logical MiB | physical MiB | physical vs ext4 | ratio | data-only physical MiB | data-only ratio | physical after initdb MiB |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, r in res.items():
        a = get(r, "sizes", "after_load") or {}
        L.append("| " + " | ".join([
            s, r.get("status", "?"), fmt(get(r, "load", "seconds"), 1), fmt(rel(r, ext4, "load", "seconds"), 2, "x"),
            mib(get(a, "logical", "total_bytes")), mib(get(a, "physical", "total_bytes")),
            fmt(rel(r, ext4, "sizes", "after_load", "physical", "total_bytes"), 2, "x"),
            fmt(get(a, "ratio"), 2), mib(get(a, "physical", "data_bytes")), fmt(get(a, "data_ratio"), 2),
            mib(get(r, "sizes", "initial", "physical", "total_bytes"))]) + " |")
    L.append("")
    L.append(f"## After {cfg.get('update_seconds')} s of updates")
    L.append("")
    L.append("| system | tps | tps vs ext4 | tps vs tundra-off | avg ms | p95 ms | logical MiB | physical MiB | physical vs ext4 | ratio | ratio after load | data-only physical MiB | data-only ratio |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for s, r in res.items():
        u = get(r, "sizes", "after_updates") or {}
        L.append("| " + " | ".join([
            s, fmt(get(r, "update", "tps"), 1), fmt(rel(r, ext4, "update", "tps"), 2, "x"),
            fmt(rel(r, off, "update", "tps"), 2, "x"),
            fmt(get(r, "update", "latency_avg_ms"), 2), fmt(get(r, "update", "latency_p95_ms"), 2),
            mib(get(u, "logical", "total_bytes")), mib(get(u, "physical", "total_bytes")),
            fmt(rel(r, ext4, "sizes", "after_updates", "physical", "total_bytes"), 2, "x"),
            fmt(get(u, "ratio"), 2), fmt(get(r, "sizes", "after_load", "ratio"), 2),
            mib(get(u, "physical", "data_bytes")), fmt(get(u, "data_ratio"), 2)]) + " |")
    L.append("")
    bt = res.get("btrfs")
    if bt and get(bt, "sizes", "after_updates", "physical", "compsize", "disk_bytes") is not None:
        parts = []
        for label in ("after_load", "after_updates"):
            ph = get(bt, "sizes", label, "physical") or {}
            cs, df = ph.get("compsize") or {}, ph.get("btrfs_df") or {}
            meta = sum(get(df, k, "used_bytes") or 0 for k in ("metadata", "system")) * 2
            other = (ph.get("total_bytes") or 0) - (cs.get("disk_bytes") or 0) - meta
            parts.append(f"{label.replace('_', ' ')}: data extents {mib(cs.get('disk_bytes'))} MiB on disk for "
                         f"{mib(cs.get('uncompressed_bytes'))} MiB uncompressed ({fmt(ratio(cs.get('uncompressed_bytes'), cs.get('disk_bytes')), 2)}), "
                         f"metadata x2 (DUP) {mib(meta)} MiB, the rest of the image's allocation {mib(other)} MiB "
                         "(allocated in the image but neither data extents nor used metadata: freed and not discarded)")
        L.append("btrfs, where its physical bytes go (compsize and `btrfs filesystem df`): " + "; ".join(parts) + ".")
        L.append("")
    L.append("Latencies are per transaction (5 statements), from pgbench's per-transaction log; tps is pgbench's "
             "(without initial connection time). Logical = apparent bytes of the cluster's files (data + WAL); "
             "physical = bytes the storage holds, each after CHECKPOINT, sync and fstrim; ratio = logical / physical.")
    L.append("")

    # size samples
    L.append("## Physical size during the updates (MiB; ratio logical/physical in parentheses)")
    L.append("")
    L.append("Sampled without CHECKPOINT or fstrim: what the storage holds at that moment.")
    L.append("")
    n = max((len(r.get("samples", [])) for r in res.values()), default=0)
    if n:
        L.append("| sample | " + " | ".join(f"{s} t s | {s}" for s in res) + " |")
        L.append("| --- | " + " | ".join("--- | ---" for _ in res) + " |")
        for i in range(n):
            cells = []
            for s, r in res.items():
                sm = r.get("samples", [])
                if i < len(sm):
                    x = sm[i]
                    cells += [fmt(x["t"], 0), f"{mib(x['physical_bytes'])} ({fmt(x.get('ratio'), 2)})"]
                else:
                    cells += ["", ""]
            L.append(f"| {i} | " + " | ".join(cells) + " |")
        L.append("")
    # tps over time
    if any(get(r, "update", "progress") for r in res.values()):
        L.append("## Throughput during the updates (pgbench -P, tps per interval)")
        L.append("")
        L.append("| t s | " + " | ".join(res) + " |")
        L.append("| --- | " + " | ".join("---" for _ in res) + " |")
        times = sorted({p["t"] for r in res.values() for p in (get(r, "update", "progress") or [])})
        for t in times:
            row = []
            for r in res.values():
                p = [x for x in (get(r, "update", "progress") or []) if x["t"] == t]
                row.append(fmt(p[0]["tps"], 1) if p else "")
            L.append(f"| {t:.0f} | " + " | ".join(row) + " |")
        L.append("")

    L.append("## Details")
    L.append("")
    for s, r in res.items():
        L.append(f"### {s}")
        L.append("")
        if r.get("status") == "failed":
            L.append(f"FAILED: {r.get('error')}")
            L.append("")
        ld = get(r, "load", "steps") or {}
        if ld:
            L.append(f"- load steps (s): create {fmt(ld.get('create_tables'), 1)}, COPY {fmt(ld.get('copy'), 1)}, "
                     f"keys {fmt(ld.get('keys'), 1)}, CHECKPOINT+VACUUM+ANALYZE+CHECKPOINT "
                     f"{fmt(ld.get('vacuum_analyze_checkpoint'), 1)}")
        for label in ("initial", "after_load", "after_updates"):
            z = get(r, "sizes", label)
            if not z:
                continue
            ph = z["physical"]
            line = (f"- {label.replace('_', ' ')}: logical {mib(z['logical']['total_bytes'])} MiB "
                    f"(data {mib(z['logical']['data_bytes'])}, WAL {mib(z['logical']['wal_bytes'])}), "
                    f"physical {mib(ph['total_bytes'])} MiB")
            if r.get("kind") == "tundra":
                line += (f" (pgdata {mib(ph.get('data_bytes'))} on the {ph.get('pgdata_device')}, "
                         f"software {mib(ph.get('pgdata_software_bytes'))}, software ratio "
                         f"{fmt(ph.get('pgdata_software_ratio'), 2)}, mix {ph.get('pgdata_mix')}; "
                         f"pgwal {mib(ph.get('wal_bytes'))}; drive GC moved {mib(ph.get('drive_gc_moved_bytes'))}; "
                         f"host files allocated {', '.join(f'{k} {mib(x)}' for k, x in (ph.get('host_files_allocated_bytes') or {}).items())})")
            else:
                line += f" (filesystem used {mib(ph.get('fs_used_bytes'))})"
            cs = ph.get("compsize")
            if cs and "disk_bytes" in cs:
                line += (f"; compsize: disk {mib(cs['disk_bytes'])}, uncompressed {mib(cs['uncompressed_bytes'])}, "
                         f"referenced {mib(cs['referenced_bytes'])} ({cs['percent']:.0f}%)")
                csw = ph.get("compsize_wal")
                if csw and "disk_bytes" in csw:
                    line += f", of which pg_wal disk {mib(csw['disk_bytes'])}"
                bdf = ph.get("btrfs_df") or {}
                if "data" in bdf and "metadata" in bdf:
                    line += (f"; btrfs data used {mib(bdf['data']['used_bytes'])} of {mib(bdf['data']['total_bytes'])} allocated, "
                             f"metadata ({bdf['metadata']['profile']}) used {mib(bdf['metadata']['used_bytes'])} of "
                             f"{mib(bdf['metadata']['total_bytes'])}")
            line += f"; ratio {fmt(z.get('ratio'), 2)}"
            L.append(line)
        mc = r.get("memory_cgroup") or {}
        for phase in ("load", "updates"):
            x = mc.get(phase)
            if x:
                L.append(f"- memory cgroup during {phase}: max usage {mib(x.get('max_usage_in_bytes'))} MiB of "
                         f"{mib(x.get('limit_in_bytes'))}, limit hit {x.get('failcnt')} times, "
                         f"major faults {get(x, 'stat', 'total_pgmajfault')}")
        if r.get("postmaster_cgroup"):
            L.append(f"- postmaster in memory cgroup {r['postmaster_cgroup']}")
        u = r.get("update") or {}
        if u:
            loads = [x["loadavg1"] for x in r.get("samples", []) if "loadavg1" in x]
            if loads:
                L.append(f"- machine load average (1 min) during the updates: {min(loads):.2f} to {max(loads):.2f} "
                         f"(2 cores; 4 pgbench clients + PostgreSQL + storage run here)")
            L.append(f"- updates: {u.get('transactions')} transactions, {u.get('failed', 0)} failed, "
                     f"p50 {fmt(u.get('latency_p50_ms'), 2)} ms, p99 {fmt(u.get('latency_p99_ms'), 2)} ms, "
                     f"max {fmt(u.get('latency_max_ms'), 1)} ms; pgbench's own latency average "
                     f"{fmt(u.get('latency_avg_ms_pgbench'), 3)} ms")
        lc = r.get("load_check")
        if lc:
            L.append(f"- load check: {lc['tables']} tables, mismatches {len(lc['mismatches'])}, "
                     f"orders {lc['orders']}, keys {'ok' if lc['keys_ok'] else 'WRONG'}")
        uc = r.get("update_check")
        if uc:
            L.append(f"- update check: bench_history {uc['history_rows']} rows for {uc['transactions']} transactions")
        fs = r.get("tundra_fsck")
        if fs:
            L.append(f"- tundra fsck after the run: {'clean' if fs['exit'] == 0 else 'exit ' + str(fs['exit'])}")
        am = r.get("amcheck")
        if am:
            L.append(f"- pg_amcheck: {'clean' if am['exit'] == 0 else 'exit ' + str(am['exit'])} "
                     f"({fmt(am['seconds'], 1)} s)")
        L.append("")

    L.append("## Problems")
    L.append("")
    if problems:
        for p in problems:
            L.append(f"- {p}")
    else:
        L.append("None seen: every system loaded and ran, the load and update checks, pg_amcheck and (Tundra) tundra fsck passed, "
                 "and no log had an error or warning line.")
    L.append("")
    return "\n".join(L)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--scale", required=True, choices=("quick", "full"))
    p.add_argument("--cache", required=True)
    p = sub.add_parser("meta")
    p.add_argument("--out", required=True)
    p.add_argument("--set", action="append")
    p = sub.add_parser("run")
    p.add_argument("--stack", required=True)
    p.add_argument("--out", required=True)
    p = sub.add_parser("fail")
    p.add_argument("--out", required=True)
    p.add_argument("--system", required=True)
    p.add_argument("--error", required=True)
    p = sub.add_parser("report")
    p.add_argument("--dir", required=True)
    a = ap.parse_args()
    try:
        return {"prepare": cmd_prepare, "meta": cmd_meta, "run": cmd_run, "fail": cmd_fail,
                "report": cmd_report}[a.cmd](a)
    except Error as e:
        print(f"bench-pg-storage: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
