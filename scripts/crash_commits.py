#!/usr/bin/env python3
"""The committing client and the commit oracle of the crash checks (scripts/check-pg-on-tundra,
scripts/check-mariadb-on-tundra). Run with the project venv (scripts/python-env): psycopg for
PostgreSQL, PyMySQL for MariaDB.

Subcommands:
  setup  --kind K CONNECTION                 creates the two tables below (if missing)
  run    --kind K CONNECTION --first-txn N --sent FILE --acked FILE [--seconds S]
                                             commits transactions N, N+1, ... until the server
                                             goes away (or S seconds pass)
  verify --kind K CONNECTION --sent FILE... --acked FILE...
                                             exit 0 when the database holds every acknowledged
                                             transaction whole, and nothing else is wrong

CONNECTION is `--host H --port P --user U --database D` (PostgreSQL) or `--socket S --user U
--database D` (MariaDB).

Each transaction T inserts PARTS rows (T, part, payload) into `crash_commits` and adds one to
`crash_counters.txns` of slot T mod SLOTS, then commits. The client appends T to the `sent`
file (fsynced) before it sends the transaction, and to the `acked` file (fsynced) only once
COMMIT has returned: the acked file is what the database promised to keep. After the storage
under the database was killed and the database recovered, `verify` checks

  1. every acknowledged transaction is there, all its rows, each with the payload it wrote;
  2. every transaction that is there is whole (all PARTS rows) and was sent: nothing invented;
  3. the counters add up to the number of transactions there (each transaction's update and
     its inserts committed together or not at all).

The sent file doubles as the oracle's injected-bug twin: read as if it were the acked file, it
is the log of a client that acknowledges a commit before COMMIT returns, and `verify` must find
a transaction missing. The transaction in flight when the storage died may well have committed
(its commit record reached the volume, only the flush failed), so `run` also holds one
transaction open on a second connection from the start: T = first-txn + HELD_OFFSET, logged as
sent, its rows inserted, its COMMIT never sent. It cannot survive the crash, so the twin is
caught in every round, not only when the kill happens to land before a commit record.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time

PARTS = 4
SLOTS = 64
HELD_OFFSET = 500_000_000


def payload(txn: int, part: int) -> str:
    """A row's payload: derived from its key, so `verify` knows what each row must hold, and
    varied enough that pages hold text, not one repeated byte."""
    rng = random.Random(txn * PARTS + part)
    words = ("ledger", "commit", "durable", "replay", "checkpoint", "torn", "page", "volume", "crash", "redo")
    return f"{txn}:{part}:" + " ".join(rng.choice(words) for _ in range(12))


class Postgres:
    def __init__(self, a):
        import psycopg
        self.errors = (psycopg.Error,)
        self.conn = psycopg.connect(host=a.host, port=a.port, user=a.user, dbname=a.database, connect_timeout=30,
                                     autocommit=True)  # each `transaction()` block is BEGIN ... COMMIT

    def setup(self):
        with self.conn.transaction():
            self.conn.execute("CREATE TABLE IF NOT EXISTS crash_commits (txn bigint NOT NULL, part int NOT NULL, "
                              "payload text NOT NULL, PRIMARY KEY (txn, part))")
            self.conn.execute("CREATE INDEX IF NOT EXISTS crash_commits_payload ON crash_commits (payload)")
            self.conn.execute("CREATE TABLE IF NOT EXISTS crash_counters (slot int PRIMARY KEY, txns bigint NOT NULL)")
            self.conn.execute("INSERT INTO crash_counters SELECT s, 0 FROM generate_series(0, %s) s "
                              "ON CONFLICT DO NOTHING", (SLOTS - 1,))

    def commit(self, txn: int):
        with self.conn.transaction():
            with self.conn.cursor() as cur:
                cur.executemany("INSERT INTO crash_commits VALUES (%s, %s, %s)",
                                [(txn, p, payload(txn, p)) for p in range(PARTS)])
                cur.execute("UPDATE crash_counters SET txns = txns + 1 WHERE slot = %s", (txn % SLOTS,))

    def hold(self, txn: int):
        """Inserts T's rows inside a transaction that is left open (no COMMIT)."""
        self.conn.execute("BEGIN")
        with self.conn.cursor() as cur:
            cur.executemany("INSERT INTO crash_commits VALUES (%s, %s, %s)",
                            [(txn, p, payload(txn, p)) for p in range(PARTS)])

    def rollback(self):
        self.conn.execute("ROLLBACK")

    def rows(self):
        return self.conn.execute("SELECT txn, part, payload FROM crash_commits").fetchall()

    def counters_sum(self) -> int:
        return int(self.conn.execute("SELECT coalesce(sum(txns), 0) FROM crash_counters").fetchone()[0])


class Mariadb:
    def __init__(self, a):
        import pymysql
        self.errors = (pymysql.Error,)
        self.conn = pymysql.connect(unix_socket=a.socket, user=a.user, database=a.database, autocommit=False,
                                    connect_timeout=30, charset="utf8mb4")

    def setup(self):
        with self.conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS crash_commits (txn bigint NOT NULL, part int NOT NULL, "
                        "payload varchar(255) NOT NULL, PRIMARY KEY (txn, part), KEY crash_commits_payload (payload)) "
                        "ENGINE=InnoDB")
            cur.execute("CREATE TABLE IF NOT EXISTS crash_counters (slot int PRIMARY KEY, txns bigint NOT NULL) "
                        "ENGINE=InnoDB")
            cur.executemany("INSERT IGNORE INTO crash_counters VALUES (%s, 0)", [(s,) for s in range(SLOTS)])
        self.conn.commit()

    def commit(self, txn: int):
        with self.conn.cursor() as cur:
            cur.executemany("INSERT INTO crash_commits VALUES (%s, %s, %s)",
                            [(txn, p, payload(txn, p)) for p in range(PARTS)])
            cur.execute("UPDATE crash_counters SET txns = txns + 1 WHERE slot = %s", (txn % SLOTS,))
        self.conn.commit()

    def hold(self, txn: int):
        """Inserts T's rows inside a transaction that is left open (no COMMIT)."""
        with self.conn.cursor() as cur:
            cur.executemany("INSERT INTO crash_commits VALUES (%s, %s, %s)",
                            [(txn, p, payload(txn, p)) for p in range(PARTS)])

    def rollback(self):
        self.conn.rollback()

    def rows(self):
        with self.conn.cursor() as cur:
            cur.execute("SELECT txn, part, payload FROM crash_commits")
            return cur.fetchall()

    def counters_sum(self) -> int:
        with self.conn.cursor() as cur:
            cur.execute("SELECT coalesce(sum(txns), 0) FROM crash_counters")
            return int(cur.fetchone()[0])


def connect(a):
    return Postgres(a) if a.kind == "postgresql" else Mariadb(a)


def append_synced(f, txn: int) -> None:
    f.write(f"{txn}\n")
    f.flush()
    os.fsync(f.fileno())


def run(a) -> int:
    """Commits until the server fails (the expected end: its storage was killed) or the time is
    up. Prints what it did; exit 0 either way, 1 only when not one transaction committed."""
    db, held = connect(a), connect(a)
    deadline = time.monotonic() + a.seconds
    txn, acked, error = a.first_txn, 0, "time up"
    held_txn = a.first_txn + HELD_OFFSET
    with open(a.sent, "a") as sent, open(a.acked, "a") as ack:
        append_synced(sent, held_txn)
        try:
            held.hold(held_txn)
        except db.errors as e:
            print(f"crash_commits: could not open the held transaction {held_txn}: {e}")
            return 1
        while time.monotonic() < deadline:
            append_synced(sent, txn)
            try:
                db.commit(txn)
            except db.errors as e:
                error = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                break
            append_synced(ack, txn)
            acked += 1
            txn += 1
    if error == "time up":
        held.rollback()
    print(f"crash_commits: {acked} transaction(s) acknowledged from {a.first_txn} (transaction {held_txn} held "
          f"open, never committed); stopped by {error}")
    return 0 if acked > 0 else 1


def read_log(paths: list[str]) -> set[int]:
    out: set[int] = set()
    for p in paths:
        with open(p) as f:
            for line in f:
                if line.strip():
                    out.add(int(line))
    return out


def verify(a) -> int:
    acked, sent = read_log(a.acked), read_log(a.sent)
    db = connect(a)
    present: dict[int, dict[int, str]] = {}
    for txn, part, text in db.rows():
        present.setdefault(int(txn), {})[int(part)] = text
    problems = []
    missing = sorted(acked - present.keys())
    if missing:
        problems.append(f"{len(missing)} acknowledged transaction(s) missing, e.g. {missing[:5]}")
    partial = sorted(t for t, parts in present.items() if set(parts) != set(range(PARTS)))
    if partial:
        problems.append(f"{len(partial)} transaction(s) only partly there, e.g. {partial[:5]}")
    wrong = sorted(t for t, parts in present.items() for p, text in parts.items() if text != payload(t, p))
    if wrong:
        problems.append(f"{len(wrong)} row(s) with a payload they were not written with, e.g. txn {wrong[:5]}")
    invented = sorted(present.keys() - sent)
    if invented:
        problems.append(f"{len(invented)} transaction(s) there that were never sent, e.g. {invented[:5]}")
    counted = db.counters_sum()
    if counted != len(present):
        problems.append(f"the counters add up to {counted}, but {len(present)} transactions are there")
    unacked_there = len(present.keys() - acked)
    print(f"crash_commits: {len(acked)} acknowledged, {len(sent)} sent, {len(present)} there "
          f"({unacked_there} committed but not acknowledged), counters {counted}")
    for p in problems:
        print(f"crash_commits: VIOLATION: {p}")
    return 1 if problems else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("setup", "run", "verify"))
    p.add_argument("--kind", choices=("postgresql", "mariadb"), required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=5432)
    p.add_argument("--socket")
    p.add_argument("--user", required=True)
    p.add_argument("--database", required=True)
    p.add_argument("--first-txn", type=int, default=1)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--sent", action="append", default=[])
    p.add_argument("--acked", action="append", default=[])
    a = p.parse_args()
    if a.kind == "mariadb" and not a.socket:
        p.error("--socket is required for MariaDB")
    if a.command == "setup":
        connect(a).setup()
        return 0
    if a.command == "run":
        if len(a.sent) != 1 or len(a.acked) != 1:
            p.error("run takes one --sent and one --acked file")
        a.sent, a.acked = a.sent[0], a.acked[0]
        return run(a)
    if not a.sent or not a.acked:
        p.error("verify needs --sent and --acked files")
    return verify(a)


if __name__ == "__main__":
    sys.exit(main())
