"""PostgreSQL 15 and MariaDB as the evaluation harness runs them: set up on the directories the
storage stack gives, started in a memory cgroup, loaded with the real datasets, updated, driven by
sysbench, checked and measured.

`make_database(kind, ...)` returns a `Database`. The harness gives it a data directory and a WAL
directory (possibly on two filesystems), a run directory (Unix socket, configuration, pid file),
a port, a memory cgroup and server settings. The server runs as the postgres / mysql user, is
born inside the cgroup (so its page cache counts against the limit too), listens on
127.0.0.1:port and on a Unix socket in the run directory, and is stopped by its PID.

What each number means:

- **load seconds** (`load_dataset`): wall time from the first CREATE TABLE to the end of the
  post-load steps: every table loaded (PostgreSQL: COPY; MariaDB: LOAD DATA LOCAL INFILE), the
  primary keys and indexes built, statistics gathered (PostgreSQL: CHECKPOINT, VACUUM, ANALYZE,
  CHECKPOINT, as scripts/datasets does; MariaDB: ANALYZE TABLE, then every dirty page flushed).
- **load checks** (`load_dataset`): per table [rows, non-NULL values, '' values in text columns],
  counted in the database and compared with what scripts/datasets.py counted in the source
  (expected.json); MariaDB's load warnings too. Every difference is listed in `mismatches`.
- **logical bytes** (`logical_bytes`): the apparent sizes (st_size) of the regular files the
  database wrote. "data": every file under the data directory (PostgreSQL: tables, indexes and
  their FSM/VM forks, catalogs, pg_xact and the cluster's other files; MariaDB: the .ibd
  tablespaces, the system tablespace with the doublewrite buffer, the undo logs, .frm files and
  the Aria system tables). "wal": every file under the WAL directory (PostgreSQL: pg_wal's
  segments; MariaDB: the redo log ib_logfile0). A page-compressed InnoDB file counts with its
  full apparent size: what the storage really holds is the storage stack's measurement.
- **update workload** (`update_workload`): sysbench running a Lua script made here (the same
  workload for both databases), one transaction per event. For each target table of the dataset
  (`UPDATE_TARGETS`) it picks a row uniformly among the rows loaded (its key is read from a key
  file extracted from the dataset), reads it, updates non-key columns to new values of the same
  kind (text: new text of the same length in characters, made of words of the dataset's own text
  in that column; integers: a new value in the column's range; amounts and measurements: a step
  up or down), and for the tables with `insert_key` inserts a copy of the row under a new key
  with new values. tps = transactions / sysbench's total time; p95_ms = sysbench's 95th
  percentile of the transaction latency (from its latency histogram, about 1% resolution);
  errors = transactions restarted after an error the database reported as transient (deadlock,
  lock wait timeout, unique violation), each counted once per failed attempt.
- **sysbench** (`sysbench_prepare`, `sysbench_run`): sysbench 1.0.20's own oltp_* scripts with
  their defaults; tps and qps are its transactions and queries per second, p95_ms its 95th
  percentile of the event latency, errors its "ignored errors", reconnects its reconnects.

Run `python -m bench.eval.databases selftest` from the repository root to exercise both
databases on a temporary directory.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import pathlib
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

if __package__ in (None, ""):
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from bench.eval.common import (REPO, BenchError, MemoryCgroup, log, parse_size, port_free,  # noqa: E402
                               run, tree_bytes)

Path = pathlib.Path

DATASETS = ("tpch", "tpcds", "nycflights13", "wikipedia")
SCALES = ("quick", "full")
SYSBENCH_WORKLOADS = ("oltp_insert", "oltp_point_select", "oltp_read_only", "oltp_read_write",
                      "oltp_write_only", "oltp_update_index", "oltp_update_non_index")
CACHE_ROOT = REPO / "target" / "bench-cache"
PG_BINDIR = Path(os.environ.get("PG_BINDIR", "/usr/lib/postgresql/15/bin"))
MARIADB_PLUGIN_DIR = Path("/usr/lib/mysql/plugin")
# InnoDB page compression algorithms that MariaDB builds as separate provider plugins (Debian:
# packages mariadb-plugin-provider-<name>); zlib is built in.
PROVIDER_ALGORITHMS = ("lz4", "lzo", "lzma", "bzip2", "snappy")

START_TIMEOUT = 300.0      # seconds a server may take to accept connections (crash recovery included)
STOP_TIMEOUT = 300.0       # seconds a clean shutdown may take before SIGKILL
FLUSH_TIMEOUT = 600.0      # seconds InnoDB may take to flush every dirty page
VOCABULARY_ROWS = 20000    # values per text column the update vocabulary is drawn from


# --- the datasets: CSV files and SQL, prepared once and cached ----------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    type: str          # the PostgreSQL type, as scripts/datasets.py writes it
    not_null: bool


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple
    csv: Path
    copy_options: str  # PostgreSQL COPY options of the CSV file

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise BenchError(f"table {self.name} has no column {name}")


@dataclass(frozen=True)
class Index:
    table: str
    name: str | None   # None for the primary key
    columns: tuple


def _split_columns(body: str) -> list[str]:
    """Splits a CREATE TABLE body at the commas outside parentheses (numeric(15,2) has one)."""
    parts, depth, cur = [], 0, []
    for ch in body:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


class DatasetFiles:
    """One dataset as scripts/datasets.py `prepare` wrote it into a cache directory: the tables
    (parsed from schema.sql, in load.tsv's order, each with its CSV file), the keys and indexes
    (parsed from indexes.sql), the PostgreSQL check query (checks.sql) and the numbers the source
    gave (expected.json)."""

    def __init__(self, dataset: str, scale: str, path: Path, stamp: dict):
        self.dataset, self.scale, self.path, self.stamp = dataset, scale, path, stamp
        schema = (path / "schema.sql").read_text()
        columns = {}
        for m in re.finditer(r"CREATE TABLE (\w+) \((.*?)\);", schema, re.S):
            cols = []
            for part in _split_columns(m.group(2)):
                c = re.fullmatch(r"(\w+)\s+(.+?)(\s+NOT NULL)?", part, re.S)
                if not c:
                    raise BenchError(f"{path}/schema.sql: cannot parse column {part!r} of {m.group(1)}")
                cols.append(Column(c.group(1), " ".join(c.group(2).split()), bool(c.group(3))))
            columns[m.group(1)] = tuple(cols)
        if schema.count("CREATE TABLE") != len(columns):
            raise BenchError(f"{path}/schema.sql: parsed {len(columns)} of {schema.count('CREATE TABLE')} tables")
        tables = []
        for line in (path / "load.tsv").read_text().splitlines():
            if not line.strip():
                continue
            name, csv_path, options = line.split("\t")
            if name not in columns:
                raise BenchError(f"{path}/load.tsv loads {name}, which schema.sql does not create")
            # load.tsv names the directory prepare ran in; the files are in this cache's csv/.
            tables.append(Table(name, columns[name], path / "csv" / Path(csv_path).name, options))
        if {t.name for t in tables} != set(columns):
            raise BenchError(f"{path}: load.tsv and schema.sql name different tables")
        self.tables = tables
        self.indexes = []
        for stmt in (path / "indexes.sql").read_text().split(";"):
            stmt = " ".join(stmt.split())
            if not stmt:
                continue
            pk = re.fullmatch(r"ALTER TABLE (\w+) ADD PRIMARY KEY \(([\w, ]+)\)", stmt)
            ix = re.fullmatch(r"CREATE INDEX (\w+) ON (\w+) \(([\w, ]+)\)", stmt)
            if pk:
                self.indexes.append(Index(pk.group(1), None, tuple(c.strip() for c in pk.group(2).split(","))))
            elif ix:
                self.indexes.append(Index(ix.group(2), ix.group(1), tuple(c.strip() for c in ix.group(3).split(","))))
            else:
                raise BenchError(f"{path}/indexes.sql: cannot parse {stmt!r}")
        self.indexes_sql = (path / "indexes.sql").read_text()
        self.checks_sql = (path / "checks.sql").read_text()
        expected = json.loads((path / "expected.json").read_text())
        self.expected = {t: [int(v) for v in vals] for t, vals in expected.items()}

    def table(self, name: str) -> Table:
        for t in self.tables:
            if t.name == name:
                return t
        raise BenchError(f"dataset {self.dataset} has no table {name}")

    def indexed_columns(self, table: str) -> set:
        return {c for ix in self.indexes if ix.table == table for c in ix.columns}

    def duckdb_source(self, table: Table) -> str:
        """A DuckDB read_csv(...) of TABLE's CSV file with PostgreSQL's CSV semantics: every
        column as text, an unquoted NULL string as NULL, a quoted one as that string."""
        opts = [o.strip() for o in table.copy_options.split(",")]
        null, header = "", False
        for o in opts:
            if o.upper() == "FORMAT CSV":
                continue
            m = re.fullmatch(r"NULL '([^']*)'", o, re.I)
            if m:
                null = m.group(1)
            elif o.upper() == "HEADER TRUE":
                header = True
            else:
                raise BenchError(f"{self.path}/load.tsv: COPY option {o!r} of {table.name} is not understood")
        cols = ", ".join(f"'{c.name}': 'VARCHAR'" for c in table.columns)
        return (f"read_csv('{table.csv}', columns={{{cols}}}, header={'true' if header else 'false'}, "
                f"nullstr='{null}', allow_quoted_nulls=false, auto_detect=false, delim=',', quote='\"', "
                "escape='\"')")


def _datasets_module():
    spec = importlib.util.spec_from_file_location("tundra_datasets", REPO / "scripts" / "datasets.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def dataset_files(dataset: str, scale: str) -> DatasetFiles:
    """The dataset's CSV files and SQL from scripts/datasets.py `prepare`, cached in
    target/bench-cache/<dataset>-<scale>/. stamp.json there is the one scripts/bench_pg_storage.py
    writes (scale, builder version, hash of datasets.py, package versions), so both reuse one
    cache; a mismatch or a missing file rebuilds it."""
    if dataset not in DATASETS:
        raise BenchError(f"unknown dataset {dataset!r} (one of {', '.join(DATASETS)})")
    if scale not in SCALES:
        raise BenchError(f"unknown scale {scale!r} (quick or full)")
    ds = _datasets_module()
    cache = CACHE_ROOT / f"{dataset}-{scale}"
    want = {
        "cache_version": 1,
        "dataset": dataset,
        "scale": scale,
        "builder_version": ds.BUILDER_VERSION,
        "datasets_py_sha256": hashlib.sha256((REPO / "scripts" / "datasets.py").read_bytes()).hexdigest(),
        "versions": {d: ds.package_version(d) for d in ds.PACKAGES[dataset]},
    }
    if dataset in ds.SCALE_FACTORS[scale]:
        want["scale_factor"] = ds.SCALE_FACTORS[scale][dataset]
    stamp = cache / "stamp.json"
    needed = ("schema.sql", "load.tsv", "indexes.sql", "checks.sql", "expected.json")
    if stamp.is_file() and all((cache / f).is_file() for f in needed):
        try:
            have = json.loads(stamp.read_text())
        except ValueError:
            have = None
        if have == want:
            files = DatasetFiles(dataset, scale, cache, want)
            if all(t.csv.is_file() for t in files.tables):
                return files
        log(f"{cache} is stale or incomplete: rebuilding")
    t0 = time.monotonic()
    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.parent / f".{cache.name}.partial.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        try:
            ds.cmd_prepare(argparse.Namespace(dataset=dataset, scale=scale, work=str(partial)))
        except ds.Error as e:
            raise BenchError(f"preparing {dataset} ({scale}) with scripts/datasets.py failed: {e}") from e
        (partial / "stamp.json").write_text(json.dumps(want, indent=1) + "\n")
        if cache.exists():
            shutil.rmtree(cache)
        partial.rename(cache)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"{dataset} ({scale}): prepared in {time.monotonic() - t0:.1f} s into {cache}")
    return DatasetFiles(dataset, scale, cache, want)


# --- the update workload: what changes, per dataset ----------------------------------------------


@dataclass(frozen=True)
class Change:
    """A non-key column the update workload changes. kind "text": new text of the old length (in
    characters) from the column's vocabulary; "int": a new integer in [low, high]; "delta": the
    old value plus a step in [-high, high] with `decimals` decimals (a NULL stays NULL)."""
    column: str
    kind: str
    low: float = 0
    high: float = 0
    decimals: int = 0


def text(column: str) -> Change:
    return Change(column, "text")


def integer(column: str, low: int, high: int) -> Change:
    return Change(column, "int", low, high)


def delta(column: str, step: float, decimals: int) -> Change:
    return Change(column, "delta", 0, step, decimals)


@dataclass(frozen=True)
class Target:
    """A table the update workload changes: `key` identifies a row (the primary key, or for a
    table without one a unique combination that starts with an indexed column list), `changes`
    are applied to it, and with `insert_key` every transaction also inserts a copy of the row
    with that integer column set to a new value above the table's largest."""
    table: str
    key: tuple
    changes: tuple
    insert_key: str | None = None


# The largest tables of each dataset (at scale full). TPC-H: lineitem, orders and partsupp (new
# orders arrive); TPC-DS: the store and catalog sales and the inventory (new store tickets arrive); nycflights13:
# the flights (no primary key; origin, time_hour, carrier, flight is unique and starts with the
# (origin, time_hour) index) and the weather; Wikipedia: the summaries.
UPDATE_TARGETS = {
    "tpch": (
        Target("orders", ("o_orderkey",), (delta("o_totalprice", 100, 2), text("o_comment")),
               insert_key="o_orderkey"),
        Target("lineitem", ("l_orderkey", "l_linenumber"), (integer("l_quantity", 1, 50), text("l_comment"))),
        Target("partsupp", ("ps_partkey", "ps_suppkey"), (integer("ps_availqty", 1, 9999), text("ps_comment"))),
    ),
    "tpcds": (
        Target("store_sales", ("ss_item_sk", "ss_ticket_number"),
               (integer("ss_quantity", 1, 100), delta("ss_net_profit", 10, 2)), insert_key="ss_ticket_number"),
        Target("catalog_sales", ("cs_item_sk", "cs_order_number"),
               (integer("cs_quantity", 1, 100), delta("cs_net_profit", 10, 2))),
        Target("inventory", ("inv_date_sk", "inv_item_sk", "inv_warehouse_sk"),
               (integer("inv_quantity_on_hand", 0, 1000),)),
    ),
    "nycflights13": (
        Target("flights", ("origin", "time_hour", "carrier", "flight"),
               (delta("dep_delay", 10, 0), delta("arr_delay", 10, 0))),
        Target("weather", ("origin", "time_hour"), (delta("temp", 2, 2), delta("pressure", 1, 1))),
    ),
    "wikipedia": (
        Target("summaries", ("lang", "key"), (text("extract"), text("description"))),
    ),
}

INTEGER_TYPES = ("smallint", "int", "integer", "bigint")
DERIVED_VERSION = 1


def _check_targets(files: DatasetFiles) -> None:
    for t in UPDATE_TARGETS[files.dataset]:
        table = files.table(t.table)
        for c in (*t.key, *(ch.column for ch in t.changes)):
            table.column(c)
        if not any(t.key[:len(ix.columns)] == ix.columns for ix in files.indexes if ix.table == t.table):
            raise BenchError(f"update key {t.key} of {t.table} does not start with a key or index of the table")
        if t.insert_key and (table.column(t.insert_key).type not in INTEGER_TYPES or t.insert_key not in t.key):
            raise BenchError(f"insert key {t.insert_key} of {t.table} must be an integer column of its key")


def _duck_value(column: Column, kind: str) -> str:
    """DuckDB SQL for a CSV column's text as KIND's server takes it in a literal or a load file:
    PostgreSQL takes the CSV text as is; MariaDB's DATETIME takes timestamps without 'T' and
    without a zone (the nycflights13 ones are UTC, written with 'Z')."""
    q = f'"{column.name}"'
    if kind == "postgresql" or column.type not in ("timestamp", "timestamptz"):
        return q
    zone = "(Z|[+]00(:?00)?)" if column.type == "timestamptz" else ""
    pattern = rf"\d{{4}}-\d\d-\d\d[T ]\d\d:\d\d:\d\d{zone}"
    value = f"regexp_replace({q}, '{zone}$', '')" if zone else q
    return (f"CASE WHEN {q} IS NULL THEN NULL WHEN regexp_full_match({q}, '{pattern}') "
            f"THEN replace({value}, 'T', ' ') "
            f"ELSE error('{column.name} value ' || {q} || ' is not a whole-second UTC timestamp') END")


class Derived:
    """What a database needs from a dataset beyond its CSV files, cached beside them in
    derived-<kind>/: a key file per update target (keys/<table>.keys: one fixed-width record per
    row loaded, the key columns' values separated by tabs, a newline, spaces up to the width, so
    that record i starts at byte i * width), the update vocabulary (vocabulary.txt: the distinct
    words of the first rows of every text column the workload changes) and, for MariaDB, every
    table as a LOAD DATA file (tsv/<table>.tsv: tab-separated, \\N for NULL, backslash escapes)."""

    def __init__(self, path: Path):
        self.path = path
        self.keys = json.loads((path / "keys.json").read_text())
        vocabulary = path / "vocabulary.txt"
        self.vocabulary = vocabulary if vocabulary.is_file() else None

    def tsv(self, table: str) -> Path:
        return self.path / "tsv" / f"{table}.tsv"


def derived_files(files: DatasetFiles, kind: str) -> Derived:
    _check_targets(files)
    out = files.path / f"derived-{kind}"
    targets = UPDATE_TARGETS[files.dataset]
    want = {"derived_version": DERIVED_VERSION, "kind": kind, "source": files.stamp,
            "targets": [repr(t) for t in targets], "vocabulary_rows": VOCABULARY_ROWS}
    stamp = out / "stamp.json"
    if stamp.is_file():
        try:
            if json.loads(stamp.read_text()) == want:
                return Derived(out)
        except ValueError:
            pass
    t0 = time.monotonic()
    partial = out.parent / f".{out.name}.partial.{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        _build_derived(files, kind, targets, partial)
        (partial / "stamp.json").write_text(json.dumps(want, indent=1) + "\n")
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    log(f"{files.dataset} ({files.scale}): {kind} key files{' and load files' if kind == 'mariadb' else ''} "
        f"made in {time.monotonic() - t0:.1f} s")
    return Derived(out)


def _build_derived(files: DatasetFiles, kind: str, targets: tuple, out: Path) -> None:
    import duckdb  # noqa: PLC0415 (only needed when the cache is built)

    con = duckdb.connect(":memory:", config={"threads": os.cpu_count() or 1, "preserve_insertion_order": True,
                                             "autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    try:
        # A session setting (DuckDB refuses it in the connection's global config).
        con.execute("SET enable_progress_bar = false")
        (out / "keys").mkdir()
        keys = {}
        words = set()
        for t in targets:
            table = files.table(t.table)
            src = files.duckdb_source(table)
            values = [_duck_value(table.column(k), kind) for k in t.key]
            line = f"concat_ws(chr(9), {', '.join(values)})"
            present = " AND ".join(f'"{k}" IS NOT NULL' for k in t.key)
            bad = " OR ".join(
                [f"regexp_matches(\"{k}\", '[\\t\\n\\r]')" for k in t.key]
                + [f"NOT regexp_full_match(\"{k}\", '-?[0-9]+')" for k in t.key
                   if table.column(k).type in INTEGER_TYPES])
            rows, width, n_bad = con.execute(
                f"SELECT count(*), max(strlen({line})) + 1, count(*) FILTER (WHERE {bad}) FROM {src} WHERE {present}"
            ).fetchone()
            if n_bad:
                raise BenchError(f"{n_bad} keys of {t.table} hold a tab or newline, or are not integers "
                                 "in an integer column")
            if not rows:
                raise BenchError(f"{t.table} has no rows to update")
            path = out / "keys" / f"{t.table}.keys"
            cur = con.execute(f"SELECT {line} FROM {src} WHERE {present}")
            with open(path, "wb") as f:
                while batch := cur.fetchmany(100_000):
                    recs = []
                    for (value,) in batch:
                        b = value.encode()
                        recs.append(b + b"\n" + b" " * (width - 1 - len(b)))
                    f.write(b"".join(recs))
            if path.stat().st_size != rows * width:
                raise BenchError(f"{path}: {path.stat().st_size} bytes, expected {rows} records of {width}")
            keys[t.table] = {"file": str(path.relative_to(out)), "rows": rows, "width": width}
            for ch in t.changes:
                if ch.kind == "text":
                    words.update(w for (w,) in con.execute(
                        f"SELECT DISTINCT w FROM (SELECT unnest(string_split_regex(\"{ch.column}\", '\\s+')) AS w "
                        f"FROM (SELECT \"{ch.column}\" FROM {src} WHERE \"{ch.column}\" IS NOT NULL "
                        f"LIMIT {VOCABULARY_ROWS})) WHERE w <> ''").fetchall())
        if any(ch.kind == "text" for t in targets for ch in t.changes):
            if not words:
                raise BenchError(f"{files.dataset}: the text columns the updates change hold no words")
            (out / "vocabulary.txt").write_text("".join(f"{w}\n" for w in sorted(words)))
        (out / "keys.json").write_text(json.dumps(keys, indent=1) + "\n")
        if kind == "mariadb":
            (out / "tsv").mkdir()
            for table in files.tables:
                fields = []
                for c in table.columns:
                    v = _duck_value(c, kind)
                    if c.type == "text":
                        v = (f"replace(replace(replace(replace({v}, '\\', '\\\\'), chr(9), '\\t'), "
                             f"chr(10), '\\n'), chr(13), '\\r')")
                    fields.append(f"coalesce({v}, '\\N')")
                con.execute(f"COPY (SELECT concat_ws(chr(9), {', '.join(fields)}) FROM {files.duckdb_source(table)}) "
                            f"TO '{out / 'tsv' / (table.name + '.tsv')}' "
                            "(FORMAT csv, HEADER false, QUOTE '', ESCAPE '')")
    except duckdb.Error as e:
        raise BenchError(f"{files.dataset}: extracting keys / load files with DuckDB failed: {e}") from e
    finally:
        con.close()


def _lua(value) -> str:
    """VALUE as a Lua literal."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, (list, tuple)):
        return "{" + ", ".join(_lua(v) for v in value) + "}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_lua(v)}" for k, v in value.items() if v is not None) + "}"
    raise TypeError(f"no Lua literal for {value!r}")


# One transaction of the update workload per sysbench event; PLAN is filled in by update_workload.
UPDATER_LUA = r"""-- Tundra evaluation: the update workload (bench/eval/databases.py made this file).
local PLAN = @PLAN@

local drv, con
local words, keyfiles, next_insert = {}, {}, {}

local function quote(v)
   if PLAN.backslash_escapes then
      v = v:gsub("\\", "\\\\")
   end
   v = v:gsub("'", "''")
   return "'" .. v .. "'"
end

function thread_init(thread_id)
   drv = sysbench.sql.driver()
   con = drv:connect()
   if PLAN.session_sql then
      con:query(PLAN.session_sql)
   end
   if PLAN.vocabulary then
      for w in io.lines(PLAN.vocabulary) do
         words[#words + 1] = w
      end
   end
   for i, t in ipairs(PLAN.targets) do
      keyfiles[i] = assert(io.open(t.keyfile, "rb"))
      if t.insert_key then
         next_insert[i] = t.insert_from + thread_id
      end
   end
end

function thread_done()
   for _, f in ipairs(keyfiles) do
      f:close()
   end
   con:disconnect()
end

-- A transient error (deadlock, lock wait timeout, unique violation) restarts the event: end what
-- is left of its transaction first.
function sysbench.hooks.before_restart_event(err)
   con:query("ROLLBACK")
end

local function characters(s)
   local _, n = s:gsub("[^\128-\191]", "")
   return n
end

-- New text of n characters: random vocabulary words separated by spaces, cut to length.
local function new_text(n)
   local parts, length = {}, -1
   while length < n do
      local w = words[sysbench.rand.uniform(1, #words)]
      parts[#parts + 1] = w
      length = length + characters(w) + 1
   end
   local s, pos = table.concat(parts, " "), 1
   for _ = 1, n do
      local b = s:byte(pos)
      pos = pos + (b < 0x80 and 1 or b < 0xE0 and 2 or b < 0xF0 and 3 or 4)
   end
   return s:sub(1, pos - 1)
end

-- The WHERE condition of a row chosen uniformly among the rows in the target's key file.
local function pick_row(i, t)
   local f = keyfiles[i]
   f:seek("set", sysbench.rand.uniform(0, t.rows - 1) * t.width)
   local record = f:read(t.width)
   local line = record:sub(1, record:find("\n", 1, true) - 1)
   local conditions, k = {}, 0
   for v in (line .. "\t"):gmatch("([^\t]*)\t") do
      k = k + 1
      local column = t.key[k]
      conditions[k] = column.name .. " = " .. (column.number and v or quote(v))
   end
   return table.concat(conditions, " AND ")
end

local function new_value(c, old_length)
   if c.kind == "text" then
      return old_length and quote(new_text(tonumber(old_length))) or c.column
   elseif c.kind == "int" then
      return string.format("%d", sysbench.rand.uniform(c.low, c.high))
   end
   local scale = 10 ^ c.decimals
   local steps = sysbench.rand.uniform(0, 2 * c.high * scale) - c.high * scale
   return string.format("%s + (%." .. c.decimals .. "f)", c.column, steps / scale)
end

function event()
   con:query("BEGIN")
   for i, t in ipairs(PLAN.targets) do
      local where = pick_row(i, t)
      local rs = con:query("SELECT " .. t.read .. " FROM " .. t.table .. " WHERE " .. where .. " LIMIT 1")
      local row = rs and rs:fetch_row()
      if row then
         local old, sets, k = {}, {}, 0
         for j, c in ipairs(t.changes) do
            if c.kind == "text" then
               k = k + 1
               old[j] = row[k]
            end
            sets[j] = c.column .. " = " .. new_value(c, old[j])
         end
         con:query("UPDATE " .. t.table .. " SET " .. table.concat(sets, ", ") .. " WHERE " .. where)
         if t.insert_key then
            local values = {}
            for j, column in ipairs(t.columns) do
               values[j] = column
               if column == t.insert_key then
                  values[j] = string.format("%d", next_insert[i])
               end
               for m, c in ipairs(t.changes) do
                  if c.column == column then
                     values[j] = new_value(c, old[m])
                  end
               end
            end
            next_insert[i] = next_insert[i] + PLAN.threads
            con:query("INSERT INTO " .. t.table .. " (" .. table.concat(t.columns, ", ") .. ") SELECT " ..
                      table.concat(values, ", ") .. " FROM " .. t.table .. " WHERE " .. where .. " LIMIT 1")
         end
      end
   end
   con:query("COMMIT")
end
"""


# --- sysbench's report --------------------------------------------------------------------------


def parse_sysbench(output: str) -> dict:
    """The totals of sysbench's final report: transactions and queries with their rates, ignored
    errors, reconnects, total time and the latency average / 95th percentile in ms."""
    pats = {
        "transactions": (r"^\s*transactions:\s+(\d+)\s+\(([\d.]+) per sec\.\)", "tps"),
        "queries": (r"^\s*queries:\s+(\d+)\s+\(([\d.]+) per sec\.\)", "qps"),
        "errors": (r"^\s*ignored errors:\s+(\d+)", None),
        "reconnects": (r"^\s*reconnects:\s+(\d+)", None),
        "total_seconds": (r"^\s*total time:\s+([\d.]+)s", None),
        "latency_avg_ms": (r"^\s*avg:\s+([\d.]+)", None),
        "p95_ms": (r"^\s*95th percentile:\s+([\d.]+)", None),
    }
    out = {}
    for key, (pat, rate) in pats.items():
        m = re.search(pat, output, re.M)
        if not m:
            tail = " | ".join(output.strip().splitlines()[-8:])
            raise BenchError(f"sysbench's report has no {key.replace('_', ' ')} line: {tail or 'no output'}")
        out[key] = float(m.group(1)) if "." in m.group(1) else int(m.group(1))
        if rate:
            out[rate] = float(m.group(2))
    return out


# --- the databases ------------------------------------------------------------------------------


def _account(user: str) -> tuple:
    try:
        pw = pwd.getpwnam(user)
    except KeyError as e:
        raise BenchError(f"user {user} does not exist (installing the server with scripts/install-deps "
                         "creates it)") from e
    return pw.pw_uid, pw.pw_gid, os.getgrouplist(user, pw.pw_gid)


def _own_dir(path: Path, user: str, mode: int, empty: bool = False) -> None:
    path.mkdir(parents=True, exist_ok=True)
    if empty and any(path.iterdir()):
        raise BenchError(f"{path} is not empty: a database is set up only on an empty directory")
    uid, gid, _ = _account(user)
    os.chown(path, uid, gid)
    os.chmod(path, mode)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:]) or "empty"
    except OSError:
        return "no log"


def _first_line(cmd: list) -> str:
    p = run(cmd, check=False)
    out = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return out[0].strip() if out else f"unavailable (exit {p.returncode})"


def _server_value(value, size_format) -> str:
    """A setting's value for the server's configuration; a size with a binary unit ("64MiB") in
    the unit the server reads (size_format(bytes))."""
    s = str(value)
    if re.fullmatch(r"\s*\d+(\.\d+)?\s*[KMGT]iB\s*", s, re.I):
        return size_format(parse_size(s))
    return s


class Database:
    """One server instance on the harness's directories. Subclasses say how to initialise, start,
    query and check their server; loading, the update workload and sysbench are shared."""

    kind = ""
    user = ""                       # the OS user the server runs as
    shutdown_signal = signal.SIGTERM
    length_function = ""            # SQL function giving a text's length in characters
    backslash_escapes = False       # whether a backslash escapes in string literals
    session_sql = None              # run first on every update workload connection

    def __init__(self, *, name: str, data_dir: Path, wal_dir: Path, run_dir: Path, port: int,
                 cgroup: MemoryCgroup, settings: dict, log_dir: Path):
        self.name = name
        self.data_dir, self.wal_dir, self.run_dir = Path(data_dir), Path(wal_dir), Path(run_dir)
        self.port, self.cgroup, self.settings = port, cgroup, dict(settings)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.server_log = self.log_dir / f"{self.kind}.log"
        self.client_log = self.log_dir / f"{self.kind}-clients.log"
        self.proc: subprocess.Popen | None = None
        self.loaded: dict = {}      # dataset -> scale
        self.sysbench_shape: tuple | None = None

    # --- what a subclass provides ---
    def init(self) -> None:
        raise NotImplementedError

    def server_command(self) -> list:
        raise NotImplementedError

    def accepts_connections(self) -> bool:
        raise NotImplementedError

    def sql(self, sql: str, db: str | None = None, log_it: bool = False) -> list:
        """Runs SQL (one or more statements) in DB; the rows of its output, tab-separated."""
        raise NotImplementedError

    def checkpoint(self) -> None:
        raise NotImplementedError

    def load_dataset(self, dataset: str, scale: str, table_options: str = "") -> dict:
        raise NotImplementedError

    def sysbench_connection(self, db: str, table_options: str = "") -> list:
        raise NotImplementedError

    def check(self) -> dict:
        raise NotImplementedError

    def versions(self) -> dict:
        raise NotImplementedError

    def quote_ident(self, name: str) -> str:
        raise NotImplementedError

    # --- process ---
    def _preexec(self):
        enter = self.cgroup.preexec()
        uid, gid, groups = _account(self.user)

        def child():
            enter()
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
        return child

    def start(self) -> None:
        """Starts the server inside the cgroup and waits (START_TIMEOUT at most) until it accepts
        connections; raises BenchError with the log's tail if it exits or does not get there."""
        if self.proc is not None and self.proc.poll() is None:
            raise BenchError(f"{self.kind} {self.name} is already running (pid {self.proc.pid})")
        cmd = self.server_command()
        with open(self.server_log, "a") as logf:
            logf.write(f"+ {shlex.join(cmd)}\n")
            logf.flush()
            try:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                             cwd=self.run_dir, preexec_fn=self._preexec(), start_new_session=True,
                                             env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
                                                  "HOME": str(self.run_dir)})
            except OSError as e:
                raise BenchError(f"starting {self.kind} ({shlex.join(cmd)}) failed: {e}") from e
        deadline = time.monotonic() + START_TIMEOUT
        while not self.accepts_connections():
            rc = self.proc.poll()
            if rc is not None:
                self.proc = None
                raise BenchError(f"{self.kind} exited ({rc}) while starting: {_tail(self.server_log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError(f"{self.kind} did not accept connections within {START_TIMEOUT:.0f} s: "
                                 f"{_tail(self.server_log)}")
            time.sleep(0.2)
        cgroup = None
        for line in Path(f"/proc/{self.proc.pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                cgroup = path
        if cgroup != self.cgroup.rel:
            self.stop()
            raise BenchError(f"{self.kind} (pid {self.proc.pid}) is in memory cgroup {cgroup}, not {self.cgroup.rel}")
        log(f"{self.name}: {self.kind} started (pid {self.proc.pid}, port {self.port}, cgroup {self.cgroup.rel})")

    def stop(self) -> None:
        """Clean shutdown by the server's PID (PostgreSQL: fast shutdown; MariaDB: normal), SIGKILL
        after STOP_TIMEOUT; then any process of the server still in the cgroup is killed by its PID.
        Does nothing when the server is not running."""
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(self.shutdown_signal)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                log(f"warning: {self.kind} (pid {proc.pid}) did not shut down within {STOP_TIMEOUT:.0f} s: SIGKILL")
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            log(f"warning: {self.kind} (pid {proc.pid}) exited with {proc.returncode}: {_tail(self.server_log, 5)}")
        deadline = time.monotonic() + 30
        while (left := self.cgroup_pids()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            log(f"warning: {self.kind} process {pid} outlived the server: SIGKILL")
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        log(f"{self.name}: {self.kind} stopped")

    def cgroup_pids(self) -> list:
        try:
            return (self.cgroup.path / "cgroup.procs").read_text().split()
        except OSError:
            return []

    def require_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise BenchError(f"{self.kind} {self.name} is not running")

    # --- sizes ---
    def logical_bytes(self) -> dict:
        """{"data", "wal"}: the apparent bytes (st_size) of the regular files under the data
        directory (the WAL directory excluded) and under the WAL directory; see the module's
        docstring for what each holds."""
        return {"data": tree_bytes(self.data_dir), "wal": tree_bytes(self.wal_dir)}

    # --- the update workload ---
    def update_workload(self, dataset: str, seconds: float, clients: int, sample_every: float, on_sample) -> dict:
        """Sustained updates of DATASET's largest tables (UPDATE_TARGETS) by CLIENTS connections
        for SECONDS; ON_SAMPLE() is called at the start, every SAMPLE_EVERY seconds and at the
        end. Returns {"transactions", "tps", "p95_ms", "errors", ...} (see the module docstring)."""
        self.require_running()
        if dataset not in self.loaded:
            raise BenchError(f"update_workload({dataset!r}) before load_dataset({dataset!r})")
        files = dataset_files(dataset, self.loaded[dataset])
        derived = derived_files(files, self.kind)
        q = self.quote_ident
        targets = []
        for t in UPDATE_TARGETS[dataset]:
            table = files.table(t.table)
            texts = [c for c in t.changes if c.kind == "text"]
            target = {
                "table": q(t.table),
                "keyfile": str(derived.path / derived.keys[t.table]["file"]),
                "rows": derived.keys[t.table]["rows"],
                "width": derived.keys[t.table]["width"],
                "key": [{"name": q(k), "number": table.column(k).type in INTEGER_TYPES} for k in t.key],
                "read": ", ".join(f"{self.length_function}({q(c.column)})" for c in texts) or "1",
                "changes": [{"column": q(c.column), "kind": c.kind, "low": c.low, "high": c.high,
                             "decimals": c.decimals} for c in t.changes],
            }
            if t.insert_key:
                largest = self.sql(f"SELECT max({q(t.insert_key)}) FROM {q(t.table)}", dataset)[0][0]
                if not re.fullmatch(r"-?\d+", largest):
                    raise BenchError(f"largest {t.insert_key} of {t.table} is {largest!r}, not an integer")
                target.update(insert_key=q(t.insert_key), insert_from=int(largest) + 1,
                              columns=[q(c.name) for c in table.columns])
            targets.append(target)
        plan = {"targets": targets, "threads": clients, "backslash_escapes": self.backslash_escapes,
                "vocabulary": str(derived.vocabulary) if derived.vocabulary else None,
                "session_sql": self.session_sql}
        script = self.log_dir / f"update-{dataset}.lua"
        script.write_text(UPDATER_LUA.replace("@PLAN@", _lua(plan)))
        duration = max(1, round(seconds))
        cmd = ["sysbench", str(script), *self.sysbench_connection(dataset), f"--threads={clients}",
               f"--time={duration}", "--events=0", "--percentile=95", "run"]
        out_path = self.log_dir / f"update-{dataset}.out"
        samples = 0
        with open(out_path, "w") as out:
            t0 = time.monotonic()
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
            except OSError as e:
                raise BenchError(f"starting sysbench failed: {e} (scripts/install-deps installs it)") from e
            try:
                on_sample()
                samples += 1
                k = 1
                while True:
                    due = t0 + k * sample_every
                    while proc.poll() is None and time.monotonic() < due:
                        time.sleep(min(0.1, max(0.0, due - time.monotonic())))
                    if proc.poll() is not None:
                        break
                    if time.monotonic() - t0 > duration + 300:
                        raise BenchError(f"sysbench (update workload) still running {duration + 300} s after start")
                    on_sample()
                    samples += 1
                    k += 1
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        output = out_path.read_text(errors="replace")
        if proc.returncode != 0 or "FATAL" in output:
            raise BenchError(f"update workload on {dataset} failed (sysbench exit {proc.returncode}): "
                             + " | ".join(output.strip().splitlines()[-10:]))
        on_sample()
        samples += 1
        result = parse_sysbench(output)
        result.update(dataset=dataset, clients=clients, samples=samples, command=shlex.join(cmd),
                      targets=[dataclasses.asdict(t) for t in UPDATE_TARGETS[dataset]])
        log(f"{self.name}: updates on {dataset}: {result['transactions']} transactions, {result['tps']:.1f} tps, "
            f"p95 {result['p95_ms']} ms, {result['errors']} errors")
        return result

    # --- sysbench ---
    def create_sysbench_db(self, table_options: str) -> None:
        raise NotImplementedError

    def after_sysbench_prepare(self, tables: list, table_options: str) -> dict:
        """Statistics (and for MariaDB the compression evidence) once sysbench made TABLES."""
        raise NotImplementedError

    def sysbench_prepare(self, tables: int, table_size: int, table_options: str = "") -> dict:
        """Creates database sbtest and sysbench's TABLES tables of TABLE_SIZE rows
        (`sysbench oltp_read_write prepare`), then statistics; row counts are verified.
        Returns {"seconds" (sysbench's prepare plus the statistics), "tables", "table_size", "rows",
        "checks_ok", "mismatches", "command"} (MariaDB: plus "compression", as load_dataset)."""
        self.require_running()
        self.create_sysbench_db(table_options)
        cmd = ["sysbench", "oltp_read_write", *self.sysbench_connection("sbtest", table_options),
               f"--tables={tables}", f"--table-size={table_size}",
               f"--threads={max(1, min(tables, os.cpu_count() or 1))}", "prepare"]
        t0 = time.monotonic()
        run(cmd, what="sysbench prepare", log_file=self.client_log, timeout=24 * 3600)
        names = [f"sbtest{i}" for i in range(1, tables + 1)]
        extra = self.after_sysbench_prepare(names, table_options)
        seconds = time.monotonic() - t0
        rows = {n: int(self.sql(f"SELECT count(*) FROM {n}", "sbtest")[0][0]) for n in names}
        mismatches = [{"table": n, "expected": table_size, "got": r} for n, r in rows.items() if r != table_size]
        self.sysbench_shape = (tables, table_size)
        log(f"{self.name}: sysbench tables prepared ({tables} x {table_size} rows) in {seconds:.1f} s")
        return {"seconds": seconds, "tables": tables, "table_size": table_size, "rows": rows,
                "checks_ok": not mismatches, "mismatches": mismatches, "command": shlex.join(cmd), **extra}

    def sysbench_run(self, workload: str, seconds: float, threads: int) -> dict:
        """One of SYSBENCH_WORKLOADS for SECONDS with THREADS threads on the prepared tables.
        Returns {"tps", "qps", "p95_ms", "errors", "reconnects", "command", ...}; a failed run
        raises BenchError with sysbench's output tail."""
        self.require_running()
        if workload not in SYSBENCH_WORKLOADS:
            raise BenchError(f"unknown sysbench workload {workload!r} (one of {', '.join(SYSBENCH_WORKLOADS)})")
        if self.sysbench_shape is None:
            raise BenchError("sysbench_run before sysbench_prepare")
        tables, table_size = self.sysbench_shape
        duration = max(1, round(seconds))
        cmd = ["sysbench", workload, *self.sysbench_connection("sbtest"), f"--tables={tables}",
               f"--table-size={table_size}", f"--threads={threads}", f"--time={duration}", "--events=0",
               "--percentile=95", "run"]
        p = run(cmd, check=False, log_file=self.client_log, timeout=duration + 600)
        output = p.stdout + p.stderr
        if p.returncode != 0 or "FATAL" in output:
            raise BenchError(f"sysbench {workload} failed (exit {p.returncode}): "
                             + " | ".join(output.strip().splitlines()[-10:]))
        result = parse_sysbench(p.stdout)
        result.update(workload=workload, threads=threads, command=shlex.join(cmd))
        return result


class PostgreSQL(Database):
    """PostgreSQL 15: initdb with pg_wal in the WAL directory (--waldir), trust authentication,
    UTF8 and the C locale; postgresql.conf gets the address, port, socket directory and the
    settings, everything else is PostgreSQL's default."""

    kind = "postgresql"
    user = "postgres"
    shutdown_signal = signal.SIGINT     # fast shutdown: a shutdown checkpoint, clients disconnected
    length_function = "length"

    def bin(self, name: str) -> str:
        path = PG_BINDIR / name
        if not path.is_file():
            raise BenchError(f"{path} not found (install postgresql-15 with scripts/install-deps, or set PG_BINDIR)")
        return str(path)

    def quote_ident(self, name: str) -> str:
        return f'"{name}"'

    def init(self) -> None:
        if len(str(self.run_dir)) + len(f"/.s.PGSQL.{self.port}") > 107:
            raise BenchError(f"run directory {self.run_dir} is too long for a Unix socket path")
        _own_dir(self.data_dir, self.user, 0o700, empty=True)
        _own_dir(self.wal_dir, self.user, 0o700, empty=True)
        _own_dir(self.run_dir, self.user, 0o755)
        run([self.bin("initdb"), "-D", str(self.data_dir), "--waldir", str(self.wal_dir), "-U", "postgres",
             "-A", "trust", "-E", "UTF8", "--locale=C"], what="initdb", user=self.user, log_file=self.client_log)
        conf = ["", "# evaluation harness (bench/eval/databases.py)", "listen_addresses = '127.0.0.1'",
                f"port = {self.port}", f"unix_socket_directories = '{self.run_dir}'"]
        for key, value in self.settings.items():
            v = _server_value(value, lambda n: f"{n // 1024}kB").replace("'", "''")
            conf.append(f"{key} = '{v}'")
        with open(self.data_dir / "postgresql.conf", "a") as f:
            f.write("\n".join(conf) + "\n")

    def server_command(self) -> list:
        return [self.bin("postgres"), "-D", str(self.data_dir)]

    def accepts_connections(self) -> bool:
        return run([self.bin("pg_isready"), "-q", "-h", str(self.run_dir), "-p", str(self.port)],
                   check=False).returncode == 0

    def psql(self, db: str) -> list:
        return [self.bin("psql"), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", str(self.run_dir),
                "-p", str(self.port), "-U", "postgres", "-d", db]

    def sql(self, sql: str, db: str | None = None, log_it: bool = False) -> list:
        p = run(self.psql(db or "postgres") + ["-A", "-t", "-F", "\t"], input=sql, what=f"psql ({db or 'postgres'})",
                log_file=self.client_log if log_it else None)
        return [line.split("\t") for line in p.stdout.splitlines() if line != ""]

    def checkpoint(self) -> None:
        """CHECKPOINT: every dirty buffer written to the data files."""
        self.require_running()
        self.sql("CHECKPOINT")

    def load_dataset(self, dataset: str, scale: str, table_options: str = "") -> dict:
        """Creates database DATASET, its tables (TABLE_OPTIONS appended to every CREATE TABLE),
        COPYs every CSV file, builds the keys and indexes, then CHECKPOINT, VACUUM, ANALYZE,
        CHECKPOINT; checks the counts against the source. See the module docstring."""
        self.require_running()
        files = dataset_files(dataset, scale)
        self.sql(f"CREATE DATABASE {dataset}", log_it=True)
        steps = {}
        t0 = time.monotonic()
        ddl = []
        for t in files.tables:
            cols = ", ".join(f"{c.name} {c.type}{' NOT NULL' if c.not_null else ''}" for c in t.columns)
            ddl.append(f"CREATE TABLE {t.name} ({cols}) {table_options};")
        self.sql("\n".join(ddl), dataset, log_it=True)
        steps["create"] = time.monotonic() - t0
        t = time.monotonic()
        for table in files.tables:
            run(self.psql(dataset) + ["-c", f"\\copy {table.name} FROM '{table.csv}' WITH ({table.copy_options})"],
                what=f"COPY into {table.name}", log_file=self.client_log)
        steps["copy"] = time.monotonic() - t
        t = time.monotonic()
        self.sql(files.indexes_sql, dataset, log_it=True)
        steps["indexes"] = time.monotonic() - t
        t = time.monotonic()
        # As scripts/datasets: CHECKPOINT first (hint bits need the commit records flushed), then
        # VACUUM (hint bits, all-visible flags) and ANALYZE, then CHECKPOINT.
        self.sql("CHECKPOINT;\nVACUUM;\nANALYZE;\nCHECKPOINT;", dataset, log_it=True)
        steps["vacuum_analyze_checkpoint"] = time.monotonic() - t
        seconds = time.monotonic() - t0
        got = {row[0]: [int(v) for v in row[1:]] for row in self.sql(files.checks_sql, dataset)}
        self.loaded[dataset] = scale
        return _load_result(dataset, scale, table_options, seconds, steps, files.expected, got, [])

    def sysbench_connection(self, db: str, table_options: str = "") -> list:
        return ["--db-driver=pgsql", f"--pgsql-host={self.run_dir}", f"--pgsql-port={self.port}",
                "--pgsql-user=postgres", f"--pgsql-db={db}"]

    def create_sysbench_db(self, table_options: str) -> None:
        if table_options:
            raise BenchError(f"sysbench's PostgreSQL driver takes no table options ({table_options!r})")
        self.sql("CREATE DATABASE sbtest", log_it=True)

    def after_sysbench_prepare(self, tables: list, table_options: str) -> dict:
        self.sql("VACUUM;\nANALYZE;", "sbtest", log_it=True)
        return {}

    def check(self) -> dict:
        """pg_amcheck --all: heap and B-tree checks of every relation of every database;
        {"tool", "databases", "seconds", "clean": True}, or BenchError with its output."""
        self.require_running()
        dbs = [r[0] for r in self.sql("SELECT datname FROM pg_database WHERE datallowconn ORDER BY 1")]
        cmd = [self.bin("pg_amcheck"), "-h", str(self.run_dir), "-p", str(self.port), "-U", "postgres",
               "--all", "--install-missing"]
        t0 = time.monotonic()
        p = run(cmd, check=False, log_file=self.client_log)
        if p.returncode != 0:
            raise BenchError(f"pg_amcheck found problems (exit {p.returncode}): "
                             + " | ".join((p.stdout + p.stderr).strip().splitlines()[-10:]))
        return {"tool": "pg_amcheck", "command": shlex.join(cmd), "databases": dbs,
                "seconds": time.monotonic() - t0, "clean": True}

    def versions(self) -> dict:
        return {"postgresql": _first_line([self.bin("postgres"), "--version"]),
                "pg_amcheck": _first_line([self.bin("pg_amcheck"), "--version"]),
                "sysbench": _first_line(["sysbench", "--version"])}


class MariaDB(Database):
    """MariaDB (10.11 here): mariadb-install-db with the redo log in the WAL directory
    (innodb_log_group_home_dir), root without password on the socket; my.cnf in the run
    directory gets the paths, address, port, utf8mb4 with the binary no-pad collation (as
    PostgreSQL's C collation: no two different strings compare equal) and the settings,
    everything else is MariaDB's default."""

    kind = "mariadb"
    user = "mysql"
    shutdown_signal = signal.SIGTERM
    length_function = "CHAR_LENGTH"
    backslash_escapes = True
    session_sql = "SET NAMES utf8mb4"   # sysbench's client library may default to another character set

    @property
    def cnf(self) -> Path:
        return self.run_dir / "my.cnf"

    @property
    def socket(self) -> Path:
        return self.run_dir / "mariadbd.sock"

    def quote_ident(self, name: str) -> str:
        return f"`{name}`"

    def init(self) -> None:
        if len(str(self.socket)) > 107:
            raise BenchError(f"run directory {self.run_dir} is too long for a Unix socket path")
        _own_dir(self.data_dir, self.user, 0o750, empty=True)
        _own_dir(self.wal_dir, self.user, 0o750, empty=True)
        _own_dir(self.run_dir, self.user, 0o755)
        lines = ["[client]", f"socket = {self.socket}", "user = root", "default-character-set = utf8mb4", "",
                 "[mariadbd]", f"datadir = {self.data_dir}", f"innodb_log_group_home_dir = {self.wal_dir}",
                 f"socket = {self.socket}", f"pid_file = {self.run_dir / 'mariadbd.pid'}", f"port = {self.port}",
                 "bind_address = 127.0.0.1", "character_set_server = utf8mb4",
                 "collation_server = utf8mb4_nopad_bin", "local_infile = ON"]
        algorithm = str(self.settings.get("innodb_compression_algorithm", "")).lower()
        if algorithm in PROVIDER_ALGORITHMS:
            plugin = MARIADB_PLUGIN_DIR / f"provider_{algorithm}.so"
            if not plugin.is_file():
                raise BenchError(f"innodb_compression_algorithm={algorithm} needs {plugin} "
                                 f"(Debian package mariadb-plugin-provider-{algorithm}; scripts/install-deps)")
            lines.append(f"plugin_load_add = provider_{algorithm}")
        for key, value in self.settings.items():
            lines.append(f"{key} = {_server_value(value, str)}")
        self.cnf.write_text("\n".join(lines) + "\n")
        run(["mariadb-install-db", f"--defaults-file={self.cnf}", "--auth-root-authentication-method=normal",
             "--skip-test-db"], what="mariadb-install-db", user=self.user, log_file=self.client_log)

    def server_command(self) -> list:
        return ["mariadbd", f"--defaults-file={self.cnf}"]

    def accepts_connections(self) -> bool:
        return run(["mariadb", f"--defaults-file={self.cnf}", "-e", "SELECT 1"], check=False).returncode == 0

    def sql(self, sql: str, db: str | None = None, log_it: bool = False) -> list:
        cmd = ["mariadb", f"--defaults-file={self.cnf}", "-B", "-N", "-r", "--local-infile=1"]
        p = run(cmd + ([db] if db else []), input=sql, what=f"mariadb ({db or 'no database'})",
                log_file=self.client_log if log_it else None)
        return [line.split("\t") for line in p.stdout.splitlines() if line != ""]

    def status(self, name: str) -> int:
        return int(self.sql(f"SHOW GLOBAL STATUS LIKE '{name}'")[0][1])

    def checkpoint(self) -> None:
        """Flushes every dirty page of the buffer pool to the data files: innodb_max_dirty_pages_pct
        (and its low-water mark) set to 0, and the page cleaner's pace (innodb_io_capacity, 200
        pages/s by default) lifted, until Innodb_buffer_pool_pages_dirty is 0; then all restored."""
        self.require_running()
        names = ("innodb_max_dirty_pages_pct_lwm", "innodb_max_dirty_pages_pct", "innodb_io_capacity_max",
                 "innodb_io_capacity")
        old = dict(zip(names, self.sql("SELECT " + ", ".join(f"@@{n}" for n in names))[0]))
        flushing = {"innodb_max_dirty_pages_pct_lwm": 0, "innodb_max_dirty_pages_pct": 0,
                    "innodb_io_capacity_max": 1000000, "innodb_io_capacity": 1000000}
        self.sql("".join(f"SET GLOBAL {n} = {v};" for n, v in flushing.items()))
        try:
            deadline = time.monotonic() + FLUSH_TIMEOUT
            while (dirty := self.status("Innodb_buffer_pool_pages_dirty")) > 0:
                if time.monotonic() > deadline:
                    raise BenchError(f"InnoDB still has {dirty} dirty pages after {FLUSH_TIMEOUT:.0f} s of flushing")
                time.sleep(0.1)
        finally:
            self.sql("".join(f"SET GLOBAL {n} = {old[n]};" for n in reversed(names)))

    def mariadb_type(self, column: Column, indexed: bool) -> str:
        """The MariaDB type of a PostgreSQL column of the datasets. text: VARCHAR(255) where a key
        or index holds it (InnoDB indexes no full TEXT), else MEDIUMTEXT (PostgreSQL's text has no
        length limit; InnoDB stores every TEXT size alike); timestamps: DATETIME (whole seconds,
        UTC), which the load files and the load warnings enforce."""
        t = column.type
        m = re.fullmatch(r"numeric\((\d+),\s*(\d+)\)", t)
        if m:
            return f"DECIMAL({m.group(1)},{m.group(2)})"
        types = {"smallint": "SMALLINT", "int": "INT", "integer": "INT", "bigint": "BIGINT", "real": "FLOAT",
                 "double precision": "DOUBLE", "date": "DATE", "timestamp": "DATETIME", "timestamptz": "DATETIME",
                 "text": "VARCHAR(255)" if indexed else "MEDIUMTEXT"}
        if t not in types:
            raise BenchError(f"column {column.name}: PostgreSQL type {t} has no MariaDB mapping here")
        return types[t]

    def load_dataset(self, dataset: str, scale: str, table_options: str = "") -> dict:
        """Creates database DATASET, its tables with MariaDB types, ENGINE=InnoDB and TABLE_OPTIONS,
        loads every table with LOAD DATA LOCAL INFILE (any warning is a mismatch), builds the same
        keys and indexes, ANALYZE TABLE, flushes every dirty page; checks the counts against the
        source and returns the compression evidence (BenchError if compression was asked for and
        did not happen). See the module docstring."""
        self.require_running()
        files = dataset_files(dataset, scale)
        derived = derived_files(files, self.kind)
        q = self.quote_ident
        self.sql(f"CREATE DATABASE {q(dataset)}", log_it=True)
        steps = {}
        t0 = time.monotonic()
        ddl = []
        for t in files.tables:
            indexed = files.indexed_columns(t.name)
            cols = ", ".join(f"{q(c.name)} {self.mariadb_type(c, c.name in indexed)}{' NOT NULL' if c.not_null else ''}"
                             for c in t.columns)
            ddl.append(f"CREATE TABLE {q(t.name)} ({cols}) ENGINE=InnoDB {table_options};")
        self.sql("\n".join(ddl), dataset, log_it=True)
        steps["create"] = time.monotonic() - t0
        t = time.monotonic()
        warnings = []
        for table in files.tables:
            rows = self.sql(f"LOAD DATA LOCAL INFILE '{derived.tsv(table.name)}' INTO TABLE {q(table.name)} "
                            "CHARACTER SET utf8mb4;\nSHOW WARNINGS LIMIT 10;", dataset, log_it=True)
            warnings += [{"table": table.name, "warning": " ".join(r)} for r in rows]
        steps["load"] = time.monotonic() - t
        t = time.monotonic()
        ix_sql = []
        for ix in files.indexes:
            cols = ", ".join(q(c) for c in ix.columns)
            ix_sql.append(f"ALTER TABLE {q(ix.table)} ADD PRIMARY KEY ({cols});" if ix.name is None
                          else f"CREATE INDEX {q(ix.name)} ON {q(ix.table)} ({cols});")
        self.sql("\n".join(ix_sql), dataset, log_it=True)
        steps["indexes"] = time.monotonic() - t
        t = time.monotonic()
        self.sql("ANALYZE TABLE " + ", ".join(q(t.name) for t in files.tables), dataset, log_it=True)
        self.checkpoint()
        steps["analyze_flush"] = time.monotonic() - t
        seconds = time.monotonic() - t0
        checks = []
        for table in files.tables:
            nonnull = " + ".join(f"count({q(c.name)})" for c in table.columns)
            empty = " + ".join(f"count(CASE WHEN {q(c.name)} = '' THEN 1 END)"
                               for c in table.columns if c.type == "text") or "0"
            checks.append(f"SELECT '{table.name}', count(*), {nonnull}, {empty} FROM {q(table.name)}")
        got = {row[0]: [int(v) for v in row[1:]] for row in self.sql("\nUNION ALL ".join(checks), dataset)}
        self.loaded[dataset] = scale
        result = _load_result(dataset, scale, table_options, seconds, steps, files.expected, got, warnings)
        result["compression"] = self.compression_evidence(dataset, table_options)
        return result

    def compression_evidence(self, db: str, table_options: str) -> dict:
        """What InnoDB says about DB's compression: the algorithm, the page compression counters
        (Innodb_num_pages_page_compressed, Innodb_page_compression_saved, ...), per tablespace its
        FILE_SIZE (apparent) and ALLOCATED_SIZE (blocks the filesystem holds, i.e. after the holes
        page compression punches), ROW_FORMAT and PAGE_SIZE, per table its ROW_FORMAT and CREATE_OPTIONS,
        and INNODB_CMP's compression operations. "effective" says whether what TABLE_OPTIONS asked
        for (PAGE_COMPRESSED=1, ROW_FORMAT=COMPRESSED) happened; if not, BenchError."""
        algorithm, level = self.sql("SELECT @@innodb_compression_algorithm, @@innodb_compression_level")[0]
        status = {r[0]: int(r[1]) for r in self.sql(
            "SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Innodb_%page%compress%' "
            "OR Variable_name LIKE 'Innodb_num_page_compressed%'")}
        spaces = [{"name": r[0], "row_format": r[1], "page_size": int(r[2]), "fs_block_size": int(r[3]),
                   "file_bytes": int(r[4]), "allocated_bytes": int(r[5])} for r in self.sql(
            "SELECT NAME, ROW_FORMAT, PAGE_SIZE, FS_BLOCK_SIZE, FILE_SIZE, ALLOCATED_SIZE FROM "
            f"information_schema.INNODB_SYS_TABLESPACES WHERE NAME LIKE '{db}/%' ORDER BY NAME")]
        tables = {r[0]: {"row_format": r[1], "create_options": r[2] if len(r) > 2 else ""} for r in self.sql(
            "SELECT TABLE_NAME, ROW_FORMAT, CREATE_OPTIONS FROM information_schema.TABLES "
            f"WHERE TABLE_SCHEMA = '{db}' ORDER BY TABLE_NAME")}
        cmp = [{"page_size": int(r[0]), "compress_ops": int(r[1]), "compress_ops_ok": int(r[2])} for r in self.sql(
            "SELECT page_size, compress_ops, compress_ops_ok FROM information_schema.INNODB_CMP "
            "WHERE compress_ops > 0")]
        opts = table_options.upper().replace(" ", "")
        asked = []
        problems = []
        if "PAGE_COMPRESSED=1" in opts:
            asked.append("PAGE_COMPRESSED=1")
            missing = [t for t, v in tables.items() if "page_compressed" not in v["create_options"].lower()]
            if missing:
                problems.append(f"tables without page_compressed: {missing}")
            if status.get("Innodb_num_pages_page_compressed", 0) == 0:
                problems.append("Innodb_num_pages_page_compressed is 0: no page was written compressed")
        if "ROW_FORMAT=COMPRESSED" in opts:
            asked.append("ROW_FORMAT=COMPRESSED")
            missing = [t for t, v in tables.items() if v["row_format"].lower() != "compressed"]
            if missing:
                problems.append(f"tables not in ROW_FORMAT=COMPRESSED: {missing}")
            flat = [s["name"] for s in spaces if s["row_format"].lower() != "compressed"]
            if flat:
                problems.append(f"tablespaces not in the compressed format: {flat}")
            if not any(c["compress_ops_ok"] for c in cmp):
                problems.append("INNODB_CMP counts no successful page compression")
        file_bytes = sum(s["file_bytes"] for s in spaces)
        allocated = sum(s["allocated_bytes"] for s in spaces)
        evidence = {"asked": asked, "effective": bool(asked) and not problems, "problems": problems,
                    "algorithm": algorithm, "level": int(level), "status": status,
                    "file_bytes": file_bytes, "allocated_bytes": allocated,
                    "allocated_ratio": allocated / file_bytes if file_bytes else None,
                    "tablespaces": spaces, "tables": tables, "cmp": cmp}
        if asked and problems:
            raise BenchError(f"{db}: {', '.join(asked)} asked for but not effective: {'; '.join(problems)}")
        return evidence

    def sysbench_connection(self, db: str, table_options: str = "") -> list:
        # sysbench 1.0.20 ignores --mysql_table_options; it pastes --mysql_storage_engine after ENGINE=.
        return ["--db-driver=mysql", f"--mysql-socket={self.socket}", "--mysql-user=root", f"--mysql-db={db}",
                f"--mysql_storage_engine={('innodb ' + table_options).strip()}"]

    def create_sysbench_db(self, table_options: str) -> None:
        self.sql("CREATE DATABASE sbtest", log_it=True)

    def after_sysbench_prepare(self, tables: list, table_options: str) -> dict:
        self.sql("ANALYZE TABLE " + ", ".join(tables), "sbtest", log_it=True)
        self.checkpoint()
        return {"compression": self.compression_evidence("sbtest", table_options)}

    def check(self) -> dict:
        """CHECK TABLE on every table of every database (system schemas' views excepted);
        {"tool", "tables", "seconds", "clean": True}, or BenchError listing what it reported."""
        self.require_running()
        t0 = time.monotonic()
        names = [f"`{r[0]}`.`{r[1]}`" for r in self.sql(
            "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
            "AND TABLE_SCHEMA NOT IN ('information_schema', 'performance_schema', 'sys') ORDER BY 1, 2")]
        bad = []
        last = {}
        for r in self.sql("CHECK TABLE " + ", ".join(names), log_it=True):
            table, _op, msg_type, msg = r[0], r[1], r[2], "\t".join(r[3:])
            if msg_type.lower() == "error":
                bad.append(f"{table}: {msg}")
            if msg_type.lower() == "status":
                last[table] = msg
        bad += [f"{t}: {m}" for t, m in last.items() if m != "OK"]
        if len(last) != len(names):
            bad.append(f"CHECK TABLE reported on {len(last)} of {len(names)} tables")
        if bad:
            raise BenchError("CHECK TABLE found problems: " + "; ".join(bad[:10]))
        return {"tool": "CHECK TABLE", "tables": len(names), "seconds": time.monotonic() - t0, "clean": True}

    def versions(self) -> dict:
        return {"mariadb": _first_line(["mariadbd", "--version"]), "sysbench": _first_line(["sysbench", "--version"])}


def _load_result(dataset, scale, table_options, seconds, steps, expected, got, warnings) -> dict:
    mismatches = [{"table": t, "expected": e, "got": got.get(t)} for t, e in expected.items() if got.get(t) != e]
    mismatches += warnings
    return {"dataset": dataset, "scale": scale, "table_options": table_options, "seconds": seconds,
            "steps": steps, "rows": {t: v[0] for t, v in got.items()}, "checks_ok": not mismatches,
            "mismatches": mismatches}


def make_database(kind: str, *, name: str, data_dir: Path, wal_dir: Path, run_dir: Path, port: int,
                  cgroup: MemoryCgroup, settings: dict, log_dir: Path) -> Database:
    classes = {"postgresql": PostgreSQL, "mariadb": MariaDB}
    if kind not in classes:
        raise BenchError(f"unknown database {kind!r} (postgresql or mariadb)")
    return classes[kind](name=name, data_dir=data_dir, wal_dir=wal_dir, run_dir=run_dir, port=port,
                         cgroup=cgroup, settings=settings, log_dir=log_dir)


# --- self-test ----------------------------------------------------------------------------------


def _free_port() -> int:
    port = 23000 + os.getpid() % 1000 * 5
    while not port_free(port):
        port += 1
    return port


def _selftest_one(kind: str, variant: str, table_options: str, extra_settings: dict, datasets: list,
                  full: bool) -> dict:
    """One server on a temporary directory: init, start in a 512 MiB memory cgroup, load DATASETS,
    with FULL the update workload and all seven sysbench workloads (else one), check, sizes, stop;
    everything it made is removed."""
    memory = {"postgresql": {"shared_buffers": "64MiB"}, "mariadb": {"innodb_buffer_pool_size": "64MiB"}}[kind]
    tmp = Path(tempfile.mkdtemp(prefix=f"tundra-dbtest.{kind}.", dir="/tmp"))
    os.chmod(tmp, 0o755)
    r = {"kind": kind, "variant": variant, "table_options": table_options, "timings": {}, "ok": False}
    cgroup = db = None

    def step(label, fn, *args):
        t0 = time.monotonic()
        out = fn(*args)
        r["timings"][label] = round(time.monotonic() - t0, 2)
        return out

    try:
        cgroup = MemoryCgroup(f"selftest.{kind}.{variant}", 512 << 20)
        db = make_database(kind, name=f"selftest.{kind}.{variant}", data_dir=tmp / "data", wal_dir=tmp / "wal",
                           run_dir=tmp / "run", port=_free_port(), cgroup=cgroup,
                           settings={**memory, **extra_settings}, log_dir=tmp / "logs")
        step("init", db.init)
        step("start", db.start)
        r["loads"] = {}
        for ds in datasets:
            load = step(f"load {ds}", db.load_dataset, ds, "quick", table_options)
            r["loads"][ds] = load
            if not load["checks_ok"]:
                raise BenchError(f"load check of {ds} failed: {load['mismatches']}")
        if full:
            samples = []
            upd = step("update_workload tpch 5 s", db.update_workload, "tpch", 5, 2, 1.0,
                       lambda: samples.append(db.logical_bytes()))
            r["update"] = {k: upd[k] for k in ("transactions", "tps", "p95_ms", "errors", "samples")}
            if upd["transactions"] <= 0 or len(samples) < 6:
                raise BenchError(f"update workload: {upd['transactions']} transactions, {len(samples)} samples")
        prep = step("sysbench_prepare 2x10000", db.sysbench_prepare, 2, 10000, table_options)
        if not prep["checks_ok"]:
            raise BenchError(f"sysbench tables: {prep['mismatches']}")
        if "compression" in prep:
            r["sysbench_compression"] = {k: prep["compression"][k] for k in
                                         ("asked", "effective", "algorithm", "file_bytes", "allocated_bytes", "status")}
        r["sysbench"] = {}
        for w in SYSBENCH_WORKLOADS if full else ("oltp_update_non_index",):
            db.checkpoint()
            res = step(f"sysbench {w} 2 s", db.sysbench_run, w, 2, 2)
            r["sysbench"][w] = {k: res[k] for k in ("tps", "qps", "p95_ms", "errors", "reconnects")}
        r["check"] = step("check", db.check)
        db.checkpoint()
        r["logical_bytes"] = db.logical_bytes()
        r["memory"] = cgroup.usage()
        step("stop", db.stop)
        r["versions"] = db.versions()
        r["ok"] = True
    except BenchError as e:
        r["error"] = str(e)
        log(f"selftest {kind}/{variant}: FAILED: {e}")
        for f in sorted((tmp / "logs").glob("*")) if (tmp / "logs").is_dir() else []:
            log(f"  {f.name}: {_tail(f, 8)}")
    finally:
        if db is not None:
            db.stop()
        if cgroup is not None:
            cgroup.remove()
        shutil.rmtree(tmp)
    for ds, load in r.get("loads", {}).items():
        comp = load.get("compression")
        if comp:
            load["compression"] = {k: comp[k] for k in ("asked", "effective", "algorithm", "file_bytes",
                                                        "allocated_bytes", "allocated_ratio", "status")}
    return r


def selftest(kinds: list, datasets: list) -> int:
    variants = {
        "postgresql": [("plain", "", {})],
        "mariadb": [("plain", "", {}),
                    ("page-lz4", "PAGE_COMPRESSED=1", {"innodb_compression_algorithm": "lz4"}),
                    ("page-zlib", "PAGE_COMPRESSED=1", {"innodb_compression_algorithm": "zlib"}),
                    ("row-compressed", "ROW_FORMAT=COMPRESSED KEY_BLOCK_SIZE=8", {})],
    }
    results = []
    t0 = time.monotonic()
    for kind in kinds:
        for variant, options, settings in variants[kind]:
            full = variant == "plain"
            log(f"selftest {kind}/{variant}: {'full' if full else 'compression'} run")
            t = time.monotonic()
            r = _selftest_one(kind, variant, options, settings, datasets if full else ["tpch"], full)
            r["seconds"] = round(time.monotonic() - t, 1)
            results.append(r)
            log(f"selftest {kind}/{variant}: {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s")
    print(json.dumps({"seconds": round(time.monotonic() - t0, 1), "results": results}, indent=1, default=str))
    return 0 if all(r["ok"] for r in results) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description="PostgreSQL and MariaDB adapters of the evaluation harness")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("selftest", help="init, start, load, update, sysbench, check and stop on a temp directory")
    p.add_argument("--kind", choices=("postgresql", "mariadb"), action="append",
                   help="database to test (repeatable; default both)")
    p.add_argument("--datasets", default="tpch,nycflights13",
                   help="comma-separated datasets loaded at scale quick (default tpch,nycflights13)")
    a = ap.parse_args()
    datasets = [d for d in a.datasets.split(",") if d]
    for d in datasets:
        if d not in DATASETS:
            ap.error(f"unknown dataset {d} (one of {', '.join(DATASETS)})")
    if "tpch" not in datasets:
        ap.error("the self-test's update workload runs on tpch: include it in --datasets")
    try:
        return selftest(a.kind or ["postgresql", "mariadb"], datasets)
    except BenchError as e:
        print(f"databases: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
