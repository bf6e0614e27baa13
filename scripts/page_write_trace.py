#!/usr/bin/env python3
"""Where a database page write could be torn on its way to a Tundra volume: the write requests a
loop device received (the kernel's `block:block_rq_issue` tracepoint) and the FUSE writes the
node received (`fuse:fuse_request_send`), recorded by `perf record` while the database ran,
matched against where the filesystem placed every page of the database's files (FIEMAP).

Usage (root; docs/atomic-writes.md runs it through scripts/trace-page-writes):
  page_write_trace.py --perf-script FILE --loop-dev MAJ,MIN --files DIR [--files DIR...]
                      --db-page-size BYTES --store-page-size BYTES [--file-pattern REGEX]

For every write request of the loop device and every database page it touches, it asks:
  - did the request carry the whole page (every byte of it), or only part of it?
  - does the page lie, on the device, inside one store page (so that the node applies it as one
    piece under one page's lock), or across two (or in pieces the filesystem put apart)?
A page write reaches the store atomically only when both hold. It prints one JSON object:
request counts and sizes at the loop device and at FUSE, and the page writes of each kind
with a few examples.
"""
from __future__ import annotations

import argparse
import array
import bisect
import collections
import fcntl
import json
import os
import re
import struct
import sys

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_LAST = 0x1
FIEMAP_HEADER = struct.Struct("=QQIIII")
FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")
FUSE_WRITE = 16
# fuse_in_header (40 bytes) and fuse_write_in (40 bytes) precede a FUSE_WRITE's data.
FUSE_WRITE_OVERHEAD = 80
# The loop device's limits that decide how the block layer may split or merge a write.
QUEUE_LIMITS = ("logical_block_size", "physical_block_size", "minimum_io_size", "optimal_io_size",
                "max_sectors_kb", "max_hw_sectors_kb", "max_segments", "max_segment_size", "stable_writes",
                "atomic_write_max_bytes", "atomic_write_unit_max_bytes", "write_cache", "fua")


def fiemap(path: str) -> list[tuple[int, int, int]]:
    """The file's extents as (logical byte, physical byte, length), all of them."""
    out: list[tuple[int, int, int]] = []
    start = 0
    with open(path, "rb") as f:
        while True:
            count = 256
            buf = array.array("B", FIEMAP_HEADER.pack(start, 2**64 - 1 - start, FIEMAP_FLAG_SYNC, 0, count, 0)
                              + bytes(FIEMAP_EXTENT.size * count))
            fcntl.ioctl(f.fileno(), FS_IOC_FIEMAP, buf, True)
            mapped = FIEMAP_HEADER.unpack_from(buf, 0)[3]
            last = False
            for i in range(mapped):
                logical, physical, length, _, _, flags, _, _, _ = FIEMAP_EXTENT.unpack_from(
                    buf, FIEMAP_HEADER.size + i * FIEMAP_EXTENT.size)
                out.append((logical, physical, length))
                last = bool(flags & FIEMAP_EXTENT_LAST)
            if mapped == 0 or last:
                return out
            start = out[-1][0] + out[-1][2]


class PageMap:
    """Every database page's pieces on the device: (device start, device end, page id), sorted."""

    def __init__(self, roots: list[str], pattern: re.Pattern, db_page: int, store_page: int):
        self.db_page, self.store_page = db_page, store_page
        pieces: list[tuple[int, int, int]] = []
        self.pages: list[dict] = []   # page id -> file, index, byte count, placement
        per_page: dict[tuple[str, int], list[tuple[int, int]]] = collections.defaultdict(list)
        for root in roots:
            for dirpath, _, names in os.walk(root):
                for name in names:
                    path = os.path.join(dirpath, name)
                    if not pattern.search(path) or not os.path.isfile(path) or os.path.islink(path):
                        continue
                    for logical, physical, length in fiemap(path):
                        pos = logical
                        while pos < logical + length:
                            index = pos // db_page
                            end = min(logical + length, (index + 1) * db_page)
                            per_page[(path, index)].append((physical + pos - logical, physical + end - logical))
                            pos = end
        for (path, index), ranges in per_page.items():
            ranges.sort()
            contiguous = all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
            first, last = ranges[0][0], ranges[-1][1]
            one_store_page = contiguous and first // store_page == (last - 1) // store_page
            pid = len(self.pages)
            self.pages.append({"file": path, "index": index, "bytes": sum(e - s for s, e in ranges),
                               "contiguous": contiguous, "one_store_page": one_store_page,
                               "aligned": contiguous and first % db_page == 0})
            pieces += [(s, e, pid) for s, e in ranges]
        pieces.sort()
        self.starts = [p[0] for p in pieces]
        self.pieces = pieces

    def touched(self, start: int, end: int) -> dict[int, int]:
        """Pages a write of [start, end) touches, with the bytes of each it carries."""
        out: dict[int, int] = collections.Counter()
        i = max(0, bisect.bisect_right(self.starts, start) - 1)
        while i < len(self.pieces) and self.pieces[i][0] < end:
            s, e, pid = self.pieces[i]
            overlap = min(e, end) - max(s, start)
            if overlap > 0:
                out[pid] += overlap
            i += 1
        return out


def parse_perf(path: str, loop_dev: str):
    """Loop write requests as (byte offset, bytes), FUSE write data sizes, the byte offsets where
    the block layer split a write bio for the loop device, the other requests by type."""
    rq = re.compile(r"block:block_rq_issue:\s+(\d+,\d+)\s+(\S+)\s+(\d+)\s+\(.*?\)\s+(\d+)\s+\+\s+(\d+)")
    fuse = re.compile(r"fuse:fuse_request_send:.*opcode (\d+) \(\w+\) len (\d+)")
    split = re.compile(r"block:block_split:\s+(\d+,\d+)\s+(\S+)\s+(\d+)\s+/\s+(\d+)")
    writes, fuse_writes, splits, other = [], [], [], collections.Counter()
    with open(path, errors="replace") as f:
        for line in f:
            m = split.search(line)
            if m:
                if m.group(1) == loop_dev and "W" in m.group(2):
                    splits.append(int(m.group(4)) * 512)
                continue
            m = rq.search(line)
            if m:
                dev, rwbs, nbytes, sector, nr = m.groups()
                if dev != loop_dev:
                    continue
                if "W" in rwbs and int(nr) > 0:
                    writes.append((int(sector) * 512, int(nr) * 512))
                else:
                    other[rwbs] += 1
                continue
            m = fuse.search(line)
            if m and int(m.group(1)) == FUSE_WRITE:
                fuse_writes.append(int(m.group(2)) - FUSE_WRITE_OVERHEAD)
    return writes, fuse_writes, splits, other


def histogram(sizes) -> dict[str, int]:
    c = collections.Counter(sizes)
    return {str(k): v for k, v in sorted(c.items(), key=lambda kv: -kv[1])[:12]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--perf-script", required=True)
    p.add_argument("--loop-dev", required=True, help="MAJ,MIN of the loop device under the database's files")
    p.add_argument("--files", action="append", required=True)
    p.add_argument("--file-pattern", default=".", help="only files whose path matches (default: all)")
    p.add_argument("--db-page-size", type=int, required=True)
    p.add_argument("--store-page-size", type=int, required=True)
    p.add_argument("--queue-dir", help="the loop device's /sys/block/loopN/queue: its limits go in the output")
    p.add_argument("--extra", action="append", default=[], help="KEY=VALUE recorded in the output as it is")
    a = p.parse_args()
    pages = PageMap(a.files, re.compile(a.file_pattern), a.db_page_size, a.store_page_size)
    writes, fuse_writes, splits, other = parse_perf(a.perf_script, a.loop_dev)
    kinds = collections.Counter()
    examples: dict[str, list] = collections.defaultdict(list)
    other_writes = 0
    for start, length in writes:
        touched = pages.touched(start, start + length)
        if not touched:
            other_writes += 1
        for pid, carried in touched.items():
            page = pages.pages[pid]
            whole = carried == page["bytes"] == a.db_page_size
            kind = ("whole" if whole else "partial") + (", one store page" if page["one_store_page"] else
                                                        ", across store pages")
            kinds[kind] += 1
            if len(examples[kind]) < 3:
                examples[kind].append({"file": os.path.basename(page["file"]), "page": page["index"],
                                       "request": [start, length], "bytes_carried": carried})
    placement = collections.Counter(
        ("contiguous" if pg["contiguous"] else "in pieces") + (", one store page" if pg["one_store_page"] else
                                                               ", across store pages")
        for pg in pages.pages if pg["bytes"] == a.db_page_size)
    queue = {}
    if a.queue_dir:
        for name in QUEUE_LIMITS:
            try:
                with open(os.path.join(a.queue_dir, name)) as f:
                    queue[name] = f.read().strip()
            except OSError:
                queue[name] = None
    print(json.dumps({
        "db_page_size": a.db_page_size, "store_page_size": a.store_page_size, "loop_queue": queue,
        **dict(kv.split("=", 1) for kv in a.extra),
        "database_pages_mapped": len(pages.pages), "page_placement": dict(placement),
        "loop_write_requests": len(writes), "loop_write_sizes": histogram(n for _, n in writes),
        "loop_writes_aligned_to_db_page": sum(1 for s, n in writes if s % a.db_page_size == 0
                                              and n % a.db_page_size == 0),
        "loop_other_requests": dict(other), "loop_writes_touching_no_database_page": other_writes,
        "block_write_splits": len(splits),
        "block_write_splits_inside_a_db_page": sum(1 for o in splits if o % a.db_page_size),
        "block_write_splits_inside_a_store_page": sum(1 for o in splits if o % a.store_page_size),
        "fuse_write_requests": len(fuse_writes), "fuse_write_sizes": histogram(fuse_writes),
        "page_writes": dict(kinds), "examples": examples,
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
