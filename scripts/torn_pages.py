#!/usr/bin/env python3
"""Torn pages through a filesystem, without a database: a writer that rewrites whole pages of
one file as a database does (each write one page, every byte of it stamped with the page's
number and a new version), while other threads make the file durable over and over; and a
checker that reads the file after a crash and counts the pages holding more than one version.
A page with two versions was torn: some of its bytes reached durable storage from one write
and some from another. scripts/check-torn-pages drives it (docs/atomic-writes.md).

Usage:
  torn_pages.py fill  FILE --pages N --page-size B             every page at version 0, fsynced
  torn_pages.py write FILE --pages N --page-size B --seconds S [--direct]
                                                               rewrites random pages until
                                                               killed, an error, or S seconds
  torn_pages.py check FILE --pages N --page-size B             prints {"pages", "torn", ...}
                                                               as JSON; exit 0 either way

--direct writes with O_DIRECT (as InnoDB does); without it, through the page cache (as
PostgreSQL 15 does).
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import struct
import sys
import threading
import time

STAMP = struct.Struct("<QQ")   # page number, version: 16 bytes, repeated over the page


def page_image(page: int, version: int, size: int) -> bytes:
    return STAMP.pack(page, version) * (size // STAMP.size)


def open_file(path: str, direct: bool) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | (os.O_DIRECT if direct else 0), 0o644)


def aligned(size: int) -> mmap.mmap:
    """A page-aligned buffer (O_DIRECT needs one)."""
    return mmap.mmap(-1, size)


def fill(a) -> int:
    fd = open_file(a.file, False)
    for page in range(a.pages):
        os.pwrite(fd, page_image(page, 0, a.page_size), page * a.page_size)
    os.fsync(fd)
    os.close(fd)
    return 0


def write(a) -> int:
    fd = open_file(a.file, a.direct)
    stop = threading.Event()
    syncs = [0]

    def syncer():
        # Durability all the time: each fdatasync pushes whatever the page cache holds, in
        # whatever state, and the node makes it durable.
        while not stop.is_set():
            try:
                os.fdatasync(fd)
            except OSError:
                stop.set()
                return
            syncs[0] += 1

    threads = [threading.Thread(target=syncer, daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    rng = random.Random(os.getpid())
    buf = aligned(a.page_size)
    versions = [0] * a.pages
    deadline = time.monotonic() + a.seconds
    writes, error = 0, "time up"
    while not stop.is_set() and time.monotonic() < deadline:
        page = rng.randrange(a.pages)
        versions[page] += 1
        buf[:] = page_image(page, versions[page], a.page_size)
        try:
            os.pwrite(fd, buf, page * a.page_size)
        except OSError as e:
            error = str(e)
            break
        writes += 1
    stop.set()
    print(json.dumps({"writes": writes, "fdatasyncs": syncs[0], "direct": a.direct, "stopped_by": error}),
          flush=True)
    return 0


def check(a) -> int:
    torn, changed, examples = 0, 0, []
    with open(a.file, "rb") as f:
        for page in range(a.pages):
            data = f.read(a.page_size)
            stamps = {data[i:i + STAMP.size] for i in range(0, len(data), STAMP.size)}
            changed += any(STAMP.unpack(s)[1] > 0 for s in stamps)
            if len(stamps) > 1:
                torn += 1
                if len(examples) < 5:
                    versions = sorted({STAMP.unpack(s) for s in stamps})
                    examples.append({"page": page, "stamps": [list(v) for v in versions][:4]})
            elif STAMP.unpack(next(iter(stamps)))[0] != page:
                torn += 1
                examples.append({"page": page, "misplaced": list(STAMP.unpack(next(iter(stamps))))})
    print(json.dumps({"pages": a.pages, "pages_changed": changed, "torn": torn, "examples": examples}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("fill", "write", "check"))
    p.add_argument("file")
    p.add_argument("--pages", type=int, required=True)
    p.add_argument("--page-size", type=int, required=True)
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--direct", action="store_true")
    a = p.parse_args()
    if a.page_size % 4096 or a.page_size <= 0:
        p.error("--page-size must be a multiple of 4096")
    return {"fill": fill, "write": write, "check": check}[a.command](a)


if __name__ == "__main__":
    sys.exit(main())
