#!/usr/bin/env python3
"""scripts/deflate_reference.py — what a per-4 KiB compressing drive stores for a file.

An independent reference (not sharing code with the Rust crates) for the
emulated compressing drive of crates/tundra-device: the file is cut into 4 KiB
blocks (the last one zero-padded), and each block is stored as

  * 0 bytes if it is all zeros;
  * otherwise its raw-deflate size rounded up to 16 bytes, unless that rounded
    size is > 4080 bytes, in which case the block is stored raw: 4096 bytes.

Prints one JSON object with `blocks`, `zero_blocks`, `raw_blocks`,
`physical_used_bytes` (the sum of the stored sizes) and `ratio`
(blocks * 4096 / physical_used_bytes), plus the configuration.

Compression is raw deflate (no zlib/gzip wrapper), level 5 by default:
  --library zlib        Python's standard zlib, compressobj(level, DEFLATED, wbits=-15)
  --library libdeflate  the PyPI `deflate` package (bindings to a bundled
                        libdeflate), deflate_compress(block, level) — run
                        scripts/python-env and use .venv/bin/python for this.
Every compressed block is decompressed again and compared with the input.

Usage: deflate_reference.py [--level N] [--library zlib|libdeflate] FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import zlib

BLOCK = 4096
GRANULE = 16
MAX_COMPRESSED = 4080  # a rounded payload above this is stored raw
ZERO_BLOCK = bytes(BLOCK)


def round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def make_codec(library: str, level: int):
    """Returns (compress, decompress, version string) for the library."""
    if library == "zlib":
        if not 0 <= level <= 9:
            sys.exit(f"deflate_reference: error: zlib levels are 0..9, not {level}")

        def compress(block: bytes) -> bytes:
            c = zlib.compressobj(level, zlib.DEFLATED, -15)
            return c.compress(block) + c.flush()

        def decompress(data: bytes) -> bytes:
            return zlib.decompress(data, -15)

        return compress, decompress, f"zlib {zlib.ZLIB_RUNTIME_VERSION} (Python {sys.version.split()[0]})"

    if library == "libdeflate":
        try:
            import deflate  # type: ignore[import-not-found]
        except ImportError:
            sys.exit(
                "deflate_reference: error: the `deflate` package is not installed in this Python; "
                "run scripts/python-env and use .venv/bin/python"
            )
        if not 0 <= level <= 12:
            sys.exit(f"deflate_reference: error: libdeflate levels are 0..12, not {level}")

        def compress(block: bytes) -> bytes:
            return bytes(deflate.deflate_compress(block, level))

        def decompress(data: bytes) -> bytes:
            return bytes(deflate.deflate_decompress(data, BLOCK))

        return compress, decompress, f"PyPI deflate {deflate.__version__} (bundled libdeflate)"

    raise AssertionError(library)


def measure(path: str, library: str, level: int) -> dict:
    compress, decompress, version = make_codec(library, level)
    size = os.path.getsize(path)
    blocks = zero_blocks = raw_blocks = 0
    physical = compressed_total = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(BLOCK)
            if not block:
                break
            if len(block) < BLOCK:
                block += bytes(BLOCK - len(block))
            blocks += 1
            if block == ZERO_BLOCK:
                zero_blocks += 1
                continue
            data = compress(block)
            if decompress(data) != block:
                sys.exit(f"deflate_reference: error: {library} round trip failed at block {blocks - 1}")
            compressed_total += len(data)
            stored = round_up(len(data), GRANULE)
            if stored > MAX_COMPRESSED:
                raw_blocks += 1
                stored = BLOCK
            physical += stored
    logical = blocks * BLOCK
    return {
        "file": path,
        "file_size": size,
        "library": library,
        "library_version": version,
        "level": level,
        "block_size": BLOCK,
        "granule": GRANULE,
        "max_compressed": MAX_COMPRESSED,
        "blocks": blocks,
        "zero_blocks": zero_blocks,
        "raw_blocks": raw_blocks,
        "compressed_bytes_unrounded": compressed_total,
        "logical_bytes": logical,
        "physical_used_bytes": physical,
        "ratio": round(logical / physical, 6) if physical else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Per-4 KiB raw-deflate storage of a file, as a compressing drive would store it."
    )
    ap.add_argument("file")
    ap.add_argument("--level", type=int, default=5, help="deflate level (default 5)")
    ap.add_argument("--library", choices=("zlib", "libdeflate"), default="zlib")
    args = ap.parse_args()
    if not os.path.isfile(args.file):
        sys.exit(f"deflate_reference: error: {args.file}: no such file (make it with scripts/pg-real-table)")
    print(json.dumps(measure(args.file, args.library, args.level), indent=2))


if __name__ == "__main__":
    main()
