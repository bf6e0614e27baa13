"""The storage stacks an evaluation compares, each a mounted filesystem for a database's files.

Two kinds:

- **Loop filesystems** (ext4, xfs, btrfs-force, btrfs-zstd): a sparse image file of the stack's
  size in its work directory, on a loop device with direct I/O (the host page cache holds none of
  it; without direct I/O, and said so in the details, where the kernel refuses), the filesystem
  made and mounted on it. The redo/WAL lives in the same filesystem: `wal_mount` is `data_mount`.
- **Tundra configurations**: a node of its own (`tundra serve`), a compressed volume `data` and,
  where the WAL bypasses compression (seed 000 §3.3.1), an uncompressed volume `wal` (mode none,
  on the fast device). The node shows each volume as a file through FUSE in its own process
  (`[[mount]]` in its config, which also creates the volume), a loop device (direct I/O) makes
  the file a block device, ext4 is made and mounted on it, as scripts/pg-on-tundra does. The
  `-nbdfuse` stacks take the older, longer path for comparison: each volume an NBD export that
  nbdfuse (a second process, over TCP) shows as a file.

Sizes follow scripts/bench-pg-storage's definitions (docs/bench-pg-storage.md, "Definitions"),
taken by `Stack.sizes()` after `Stack.trim()`:

- `physical_bytes`, what the storage holds:
  - loop filesystems: the bytes the host filesystem allocates to the image file
    (`st_blocks * 512`), the filesystem's own metadata included;
  - Tundra: from `tundra stats --json`, the `physical_bytes_attributed` of the data volume (the
    drive's `physical_used_bytes`, i.e. the payloads of its live records, each rounded up to 16
    bytes, shared out among the drive's volumes by their software bytes; the data volume is the
    drive's only volume) plus that of the WAL volume where there is one (the 4 KiB blocks its
    pages take on the fast device). The drive's garbage not yet collected is not in it.
- `data_physical_bytes`, `wal_physical_bytes`: the data volume's and the WAL volume's parts of
  `physical_bytes` where the stack keeps them apart (Tundra with the WAL on its own volume);
  None where one filesystem holds both.
- `fs_used_bytes`: what the mounted filesystems count as used (`statvfs`: blocks minus free
  blocks, times the fragment size), summed over the stack's mounts.
- `details`: per kind, how that was arrived at (below, in each class's `sizes`).

Every command a stack runs is appended to `log_dir/stack.log`; the node's and nbdfuse's output go
to `log_dir/tundra.log` and `log_dir/nbdfuse-<volume>.log`. Processes are stopped by the PIDs
recorded when they were started, loop devices detached by the names recorded when they were
attached (and only while they still serve the stack's own file), and nothing is removed through a
mount.

Self-test: `python -m bench.eval.stacks selftest [--stacks a,b,...]` (root, from the repository).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.eval.common import (REPO, BenchError, allocated_bytes, log, parse_size, pid_alive,  # noqa: E402
                               port_free, run, stop_pid)

STACKS: dict[str, str] = {
    "ext4": "ext4 on a loop device over a sparse image; WAL on the same filesystem (uncompressed baseline)",
    "xfs": "xfs on a loop device over a sparse image; WAL on the same filesystem (uncompressed)",
    "btrfs-force": "btrfs mounted with compress-force=zstd:1 on a loop device over a sparse image; WAL on it",
    "btrfs-zstd": "btrfs mounted with compress=zstd (level 3; its heuristic may store data uncompressed); WAL on it",
    "tundra": "Tundra, both layers: software Algorithm 1 (lz4 or zstd per page), drive compression on; "
              "WAL on a mode none volume",
    "tundra-zstd": "Tundra: software zstd for every page, drive compression on; WAL on a mode none volume",
    "tundra-lz4": "Tundra: software lz4 for every page, drive compression on; WAL on a mode none volume",
    "tundra-drive-only": "Tundra: software compression off, drive compression on; WAL on a mode none volume",
    "tundra-software-only": "Tundra: software Algorithm 1, drive compression off; WAL on a mode none volume",
    "tundra-off": "Tundra with compression off in both layers; WAL on a mode none volume "
                  "(Tundra's uncompressed baseline)",
    "tundra-drive-only-wal-on-data": "Tundra: software off, drive on; WAL in a directory on the data volume "
                                     "(no redo bypass)",
    "tundra-zstd-wal-on-data": "Tundra: software zstd, drive on; WAL in a directory on the data volume "
                               "(no redo bypass)",
    "tundra-off-nbdfuse": "Tundra with compression off in both layers, through NBD and nbdfuse instead of the "
                          "in-process mount (the block path before it)",
    "tundra-nbdfuse": "Tundra, both layers, through NBD and nbdfuse instead of the in-process mount",
    "tundra-drive-inline": "Tundra, both layers, the drive compressing inline in the writer's thread "
                           "(its deferred mode off)",
    "tundra-off-nbdfuse-serial": "Tundra with compression off through NBD and nbdfuse, one request in flight "
                                 "per connection (the NBD server before requests ran side by side)",
    "fuse-null": "ext4 on a loop device over the in-process FUSE export of `tundra mount` with a plain O_DIRECT "
                 "host file behind it instead of a volume (`tundra bench null-export`): what FUSE and the loop "
                 "device cost without the store; WAL on a second such export, as tundra-off's WAL volume",
    "tundra-busy": "Tundra, both layers, Algorithm 1 told the host is always busy (lz4 without comparing), "
                   "the idle-host pass off",
    "tundra-busy-rechoose": "Tundra, both layers, Algorithm 1 told the host is always busy, the pass that "
                            "chooses such pages again running whatever the load at 2048 pages/s",
}


@dataclass(frozen=True)
class TundraSettings:
    software: str       # [compression] software: auto (Algorithm 1), lz4, zstd or off
    drive: str          # [drive] compression: on or off
    wal_volume: bool    # the WAL on its own mode none volume (redo bypass), else on the data volume
    access: str = "mount"   # "mount": FUSE in the node's process; "nbdfuse": NBD and nbdfuse
    drive_deferred: bool = True  # [drive] deferred: the drive compresses off the writer's path
    compression_extra: tuple = ()  # more `key = value` lines for [compression]
    limits_extra: tuple = ()       # `key = value` lines for [limits]


TUNDRA_SETTINGS = {
    "tundra": TundraSettings("auto", "on", True),
    "tundra-zstd": TundraSettings("zstd", "on", True),
    "tundra-lz4": TundraSettings("lz4", "on", True),
    "tundra-drive-only": TundraSettings("off", "on", True),
    "tundra-software-only": TundraSettings("auto", "off", True),
    "tundra-off": TundraSettings("off", "off", True),
    "tundra-drive-only-wal-on-data": TundraSettings("off", "on", False),
    "tundra-zstd-wal-on-data": TundraSettings("zstd", "on", False),
    "tundra-off-nbdfuse": TundraSettings("off", "off", True, access="nbdfuse"),
    "tundra-nbdfuse": TundraSettings("auto", "on", True, access="nbdfuse"),
    "tundra-drive-inline": TundraSettings("auto", "on", True, drive_deferred=False),
    "tundra-off-nbdfuse-serial": TundraSettings("off", "off", True, access="nbdfuse",
                                                limits_extra=("nbd_requests_in_flight = 1",)),
    "tundra-busy": TundraSettings("auto", "on", True, compression_extra=(
        "cpu_busy_threshold = 0.0", "rechoose_pages_per_second = 0")),
    "tundra-busy-rechoose": TundraSettings("auto", "on", True, compression_extra=(
        "cpu_busy_threshold = 0.0", "rechoose_pages_per_second = 2048", "rechoose_idle_threshold = 1.0")),
}

# Loop filesystems: mkfs command (the device appended) and mount options.
LOOP_FILESYSTEMS = {
    # Inode tables and journal are not zero-filled: the sparse image reads as zeros anyway, and
    # zero-filling would add about 3% of the filesystem's size of allocated zeros to the baseline.
    "ext4": (["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=1,lazy_journal_init=1"], "noinit_itable"),
    # xfs's defaults: mkfs writes its log (64 MiB up to a few tens of GiB) as zeros, so the
    # image holds that much from the start; it is counted, as it is what the storage holds.
    "xfs": (["mkfs.xfs", "-q", "-f"], None),
    "btrfs-force": (["mkfs.btrfs", "-q", "-f"], "compress-force=zstd:1"),
    "btrfs-zstd": (["mkfs.btrfs", "-q", "-f"], "compress=zstd"),
}


def _node_page_bytes() -> int:
    """The node's page cache per device under the budget: TUNDRA_BENCH_NODE_PAGE_BYTES, else 16 MiB."""
    text = os.environ.get("TUNDRA_BENCH_NODE_PAGE_BYTES")
    if text is None:
        return 16 << 20
    if not text.isdigit() or int(text) == 0:
        raise SystemExit(f"TUNDRA_BENCH_NODE_PAGE_BYTES={text!r}: give a positive number of bytes")
    return int(text)


# The node's caches on a stack measured under a database's memory budget: decompressed pages
# worth `page_bytes` per device (the node counts its cache in pages per page size and device,
# so the count follows the page size: 2,048 pages of 8 KiB, 1,024 of 16 KiB) and `write_back`
# bytes, 48 MiB in all with both devices, taken out of the database's budget (bench/eval/run.py;
# the node's defaults, 4,096 pages and 64 MiB, take 128 MiB at 8 KiB pages). The environment
# variable TUNDRA_BENCH_NODE_PAGE_BYTES sets the pages' bytes per device for a run (an A/B of the
# cache's size: bench/results/2026-12-02-node-cache/).
NODE_CACHE = {"page_bytes": _node_page_bytes(), "write_back": "16MiB"}


def node_cache_bytes() -> int:
    """What NODE_CACHE holds at most: pages on both devices and the write-back bytes."""
    return 2 * NODE_CACHE["page_bytes"] + parse_size(NODE_CACHE["write_back"])


def node_cache_pages(page_size: int) -> int:
    """`cache.pages` for a node under the budget: NODE_CACHE's bytes per device at PAGE_SIZE."""
    return max(1, NODE_CACHE["page_bytes"] // page_size)

NODE_START_SECONDS = 60
NBDFUSE_START_SECONDS = 30
NODE_STOP_SECONDS = 60
COMMAND_SECONDS = 600


def mounted(path: Path) -> bool:
    """Whether something is mounted on PATH, read from the mount table (unlike a stat, this also
    sees a FUSE mount whose server died)."""
    p = subprocess.run(["findmnt", "-rn", "-M", str(path)], capture_output=True, text=True)
    return p.returncode == 0


def parse_btrfs_df(p: subprocess.CompletedProcess) -> dict:
    """`btrfs filesystem df -b`'s output: total (allocated chunks) and used bytes per block group
    type, or the error it printed."""
    out = {}
    for line in p.stdout.splitlines():
        m = re.match(r"(\w+), (\w+): total=(\d+), used=(\d+)", line.strip())
        if m:
            out[m.group(1).lower()] = {"profile": m.group(2), "total_bytes": int(m.group(3)),
                                       "used_bytes": int(m.group(4))}
    if not out:
        out["error"] = (p.stderr or p.stdout).strip()[-300:]
    return out


def mounts_under(root: Path) -> list[str]:
    """Mount points at or under ROOT."""
    p = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True)
    prefix = str(root).rstrip("/")
    # findmnt -r escapes blanks and the like as \xNN; the stack's paths have none.
    return [t for t in p.stdout.split() if t == prefix or t.startswith(prefix + "/")]


def loop_backings() -> dict[str, str]:
    """Every attached loop device (anyone's) and its backing file, read from sysfs: no stat of
    the file, which fails for a FUSE file whose server died."""
    out = {}
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            out["/dev/" + f.parts[3]] = f.read_text().strip().removesuffix(" (deleted)")
        except OSError:
            continue  # detached meanwhile
    return out


def loops_under(root: Path) -> list[str]:
    """Loop devices whose backing file is under ROOT, as "DEVICE FILE"."""
    prefix = str(root).rstrip("/") + "/"
    return sorted(f"{dev} {path}" for dev, path in loop_backings().items() if path.startswith(prefix))


def loop_devices_of(backing: Path) -> list[str]:
    """Loop devices serving the file BACKING."""
    return sorted(dev for dev, path in loop_backings().items() if path == str(backing))


def first_line(cmd: list[str]) -> str:
    """The first line a version command prints (on stdout or stderr), or why there is none."""
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    lines = (p.stdout.strip() or p.stderr.strip()).splitlines()
    return lines[0].strip() if lines else "unknown"


def statvfs_used(path: Path) -> int:
    """Bytes the filesystem mounted at PATH counts as used: (blocks - free blocks) * fragment size."""
    v = os.statvfs(path)
    return (v.f_blocks - v.f_bfree) * v.f_frsize


class Stack:
    """One storage stack: `setup` builds it, `data_mount` and `wal_mount` are then mounted
    directories (`wal_mount` is `data_mount` itself where the WAL shares the data's
    filesystem), `trim` and `sizes` measure it, `teardown` takes it down, `post_check` checks
    what it left. The module docstring defines every size."""

    name: str
    description: str
    data_mount: Path
    wal_mount: Path
    # Whether the stack compresses what it stores (the self-test's plausibility check).
    compresses: bool

    def __init__(self, name: str, *, work_dir: Path, size_bytes: int, log_dir: Path):
        self.name = name
        self.description = STACKS[name]
        self.work_dir = Path(work_dir).resolve()
        self.size_bytes = size_bytes
        self.log_dir = Path(log_dir)
        self.log_file = self.log_dir / "stack.log"
        self.data_mount = self.work_dir / "mnt" / "data"
        self.wal_mount = self.data_mount
        self._mounts: list[Path] = []          # filesystems mounted by setup, in mount order
        self._loops: dict[str, dict] = {}      # name -> dev, backing, dio, dio_error
        self._fstrim_bytes: dict[str, int | None] = {}

    # --- what every kind shares ------------------------------------------------------------
    def _run(self, cmd: list, what: str, check: bool = True, timeout: float = COMMAND_SECONDS):
        return run([str(c) for c in cmd], what=f"{self.name}: {what}", check=check,
                   log_file=self.log_file, timeout=timeout)

    def _attempt(self, cmd: list, what: str, problems: list[str], timeout: float = 300) -> bool:
        """Runs a teardown step: whether it succeeded; a step that hangs past TIMEOUT is a
        problem, and teardown goes on with the next."""
        try:
            return self._run(cmd, what, check=False, timeout=timeout).returncode == 0
        except BenchError as e:
            problems.append(str(e))
            return False

    def _prepare_dirs(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        # A database runs as its own user: it must be able to reach the mount points.
        for d in (self.work_dir, self.work_dir / "mnt"):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o755)
        if mounts_under(self.work_dir) or loops_under(self.work_dir):
            raise BenchError(f"{self.name}: {self.work_dir} is in use already (mounts: "
                             f"{mounts_under(self.work_dir)}, loop devices: {loops_under(self.work_dir)})")

    def _attach_loop(self, name: str, backing: Path) -> str:
        """A loop device over BACKING with direct I/O, or without it (recorded in the details)
        where the kernel refuses; returns the device."""
        p = self._run(["losetup", "-f", "--show", "--direct-io=on", backing], f"losetup --direct-io=on {name}",
                      check=False)
        dio_error = None
        if p.returncode == 0:
            dev = p.stdout.strip()
        else:
            dio_error = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:]) or f"exit {p.returncode}"
            # losetup may have attached a device before failing to switch direct I/O on; the
            # backing file is this stack's own, so such a device is too.
            for stray in loop_devices_of(backing):
                self._run(["losetup", "-d", stray], f"losetup -d {stray}")
            log(f"{self.name}: losetup --direct-io=on refused for {name} ({dio_error}): without direct I/O")
            dev = self._run(["losetup", "-f", "--show", backing], f"losetup {name}").stdout.strip()
        if not dev.startswith("/dev/loop"):
            raise BenchError(f"{self.name}: losetup on {backing} printed no device: {dev!r}")
        dio_file = Path(f"/sys/block/{Path(dev).name}/loop/dio")
        dio = dio_file.exists() and dio_file.read_text().strip() == "1"
        if not dio and dio_error is None:
            dio_error = p.stderr.strip() or "losetup succeeded, but the kernel reports direct I/O off"
        self._loops[name] = {"dev": dev, "backing": str(backing), "dio": dio, "dio_error": dio_error}
        return dev

    def _detach_loops(self, problems: list[str]) -> None:
        """Detaches the loop devices this stack attached, each only while it still serves the
        stack's own file."""
        for name, lp in list(self._loops.items()):
            if lp["dev"] in loop_devices_of(Path(lp["backing"])):
                if not self._attempt(["losetup", "-d", lp["dev"]], f"losetup -d {lp['dev']}", problems):
                    problems.append(f"could not detach {lp['dev']} ({lp['backing']}): see {self.log_file}")
                    continue
            del self._loops[name]

    def _mount(self, dev: str, mnt: Path, options: str | None) -> None:
        mnt.mkdir(parents=True, exist_ok=True)
        self._run(["mount"] + (["-o", options] if options else []) + [dev, mnt], f"mount {dev} on {mnt}")
        self._mounts.append(mnt)
        mnt.chmod(0o755)

    def _unmount(self, mnt: Path, problems: list[str]) -> None:
        """Unmounts MNT, retrying while it is busy; lazily (a problem) as the last resort."""
        for _ in range(40):
            if not mounted(mnt):
                return
            if not self._attempt(["umount", mnt], f"umount {mnt}", problems):
                time.sleep(0.25)
        if mounted(mnt):
            self._attempt(["umount", "-l", mnt], f"umount -l {mnt}", problems)
            problems.append(f"{mnt} stayed busy: unmounted lazily")

    def _unmount_all(self, problems: list[str]) -> None:
        for mnt in reversed(self._mounts):
            self._unmount(mnt, problems)
        self._mounts = [m for m in self._mounts if mounted(m)]

    def _distinct_mounts(self) -> list[Path]:
        return list(dict.fromkeys([self.data_mount, self.wal_mount]))

    def _fs_used(self) -> int:
        return sum(statvfs_used(m) for m in self._distinct_mounts())

    def _loop_details(self) -> dict:
        return {n: dict(lp) for n, lp in self._loops.items()}

    # --- the interface ---------------------------------------------------------------------
    def setup(self) -> None:
        """Builds the stack; on failure takes down what was built and raises BenchError naming
        the step, its command and the end of its output."""
        try:
            self._prepare_dirs()
            self._build()
        except BaseException as e:
            left = ""
            try:
                self.teardown()
            except BenchError as t:
                left = f"; then {str(t).removeprefix(self.name + ': ')}"
            if isinstance(e, (BenchError, OSError)):
                raise BenchError(f"{self.name}: setup failed: {str(e).removeprefix(self.name + ': ')}{left}") from e
            if left:
                log(f"{self.name}: {left[2:]}")
            raise

    def _build(self) -> None:
        raise NotImplementedError

    def trim(self) -> None:
        """sync, `fstrim -v` of every mount of the stack (the bytes each reports go into the
        details of the next `sizes`), sync: freed blocks leave the storage before it is measured."""
        os.sync()
        for m in self._distinct_mounts():
            p = self._run(["fstrim", "-v", m], f"fstrim {m}")
            found = re.search(r"\((\d+) bytes\)", p.stdout)
            self._fstrim_bytes[str(m)] = int(found.group(1)) if found else None
        os.sync()

    def sizes(self) -> dict:
        raise NotImplementedError

    def teardown(self) -> None:
        raise NotImplementedError

    def post_check(self) -> dict:
        """Checks what the stack left after teardown; {} where there is nothing to check."""
        return {}

    def versions(self) -> dict:
        return {"kernel": os.uname().release, "util_linux": first_line(["losetup", "--version"])}


class LoopFsStack(Stack):
    """ext4, xfs or btrfs on a loop device over a sparse image file of the stack's size."""

    def __init__(self, name: str, **kw):
        super().__init__(name, **kw)
        self.image = self.work_dir / f"{name}.img"
        self.mkfs, self.mount_options = LOOP_FILESYSTEMS[name]
        self.btrfs = name.startswith("btrfs")
        self.compresses = self.btrfs
        self._image_made = False

    def _build(self) -> None:
        if self.image.exists():
            raise BenchError(f"{self.image} exists already")
        with open(self.image, "wb") as f:
            self._image_made = True
            f.truncate(self.size_bytes)
        dev = self._attach_loop(self.name, self.image)
        self._run(self.mkfs + [dev], self.mkfs[0])
        if self.btrfs:
            # The kernel's btrfs device list must know a fresh filesystem's device before mount;
            # udev does that on most machines, not in every container.
            self._run(["btrfs", "device", "scan", dev], "btrfs device scan", check=False)
        self._mount(dev, self.data_mount, self.mount_options)

    def sizes(self) -> dict:
        """physical_bytes: the image file's allocated bytes (filesystem metadata included);
        data_physical_bytes, wal_physical_bytes: None (one filesystem holds both). details:
        image_size_bytes, image_allocated_bytes, the loop device and its direct I/O state, the
        bytes the last fstrim reported; for btrfs also compsize's totals over the whole
        filesystem (`disk_bytes` the data extents take, `uncompressed_bytes`,
        `referenced_bytes`, per type) and `btrfs filesystem df -b` (bytes allocated to and used
        in each block group type)."""
        physical = allocated_bytes(self.image)
        details = {"filesystem": self.name.split("-")[0], "mkfs": " ".join(self.mkfs),
                   "mount_options": self.mount_options or "defaults",
                   "image": str(self.image), "image_size_bytes": os.stat(self.image).st_size,
                   "image_allocated_bytes": physical, "loops": self._loop_details(),
                   "fstrim_bytes": dict(self._fstrim_bytes)}
        if self.btrfs:
            details["compsize"] = self._compsize()
            details["btrfs_df"] = self._btrfs_df()
        fs_used = self._fs_used()
        return {"physical_bytes": physical, "data_physical_bytes": None, "wal_physical_bytes": None,
                "fs_used_bytes": fs_used, "live_bytes": fs_used, "allocated_bytes": physical, "details": details}

    def _compsize(self) -> dict:
        p = self._run(["compsize", "-b", "-x", self.data_mount], "compsize", check=False)
        out: dict = {"types": {}}
        for line in p.stdout.splitlines():
            f = line.split()
            if len(f) == 5 and f[1].endswith("%") and f[2].isdigit():
                row = {"disk_bytes": int(f[2]), "uncompressed_bytes": int(f[3]), "referenced_bytes": int(f[4])}
                if f[0] == "TOTAL":
                    out.update(row)
                else:
                    out["types"][f[0]] = row
        if "disk_bytes" not in out:
            out["error"] = f"no TOTAL line (exit {p.returncode}): {(p.stderr or p.stdout).strip()[-300:]}"
        return out

    def _btrfs_df(self) -> dict:
        return parse_btrfs_df(self._run(["btrfs", "filesystem", "df", "-b", self.data_mount],
                                        "btrfs filesystem df", check=False))

    def teardown(self) -> None:
        """Unmounts, detaches the loop device, removes the image; raises BenchError listing
        whatever could not be undone (after trying everything)."""
        problems: list[str] = []
        self._unmount_all(problems)
        if not self._mounts:
            self._detach_loops(problems)
        if self._image_made and self.image.exists():
            if self._mounts or loop_devices_of(self.image):
                problems.append(f"left {self.image} in place: still in use")
            else:
                self.image.unlink()
                self._image_made = False
        if problems:
            raise BenchError(f"{self.name}: teardown: " + "; ".join(problems))

    def versions(self) -> dict:
        v = super().versions()
        if self.btrfs:
            v["btrfs_progs"] = first_line(["mkfs.btrfs", "--version"])
            v["compsize"] = first_line(["dpkg-query", "-W", "-f", "${Version}", "btrfs-compsize"])
        elif self.name == "xfs":
            v["xfsprogs"] = first_line(["mkfs.xfs", "-V"])
        else:
            v["e2fsprogs"] = first_line(["mkfs.ext4", "-V"])
        return v


class TundraStack(Stack):
    """A Tundra node of its own in `work_dir/tundra-data`, its volumes as ext4 filesystems
    through files the node mounts (or nbdfuse, for the `-nbdfuse` stacks) and loop devices. Drive physical capacity = the stack's size (its logical
    capacity the node's default, twice that); fast-device space for uncompressed volumes = half
    the stack's size. The data volume has the stack's size; the WAL volume, where there is one,
    takes all of the fast device's volume space."""

    def __init__(self, name: str, *, tundra_bin: Path, ports: dict, page_size: int, node_cgroup=None, **kw):
        super().__init__(name, **kw)
        self.settings = TUNDRA_SETTINGS[name]
        # The database's memory cgroup, when the node's memory is to count against the
        # database's budget (bench/eval/run.py): the node starts inside it, caches cut to fit.
        self.node_cgroup = node_cgroup
        self.compresses = self.settings.software != "off" or self.settings.drive != "off"
        self.tundra_bin = Path(tundra_bin)
        self.ports = ports
        if page_size not in (8192, 16384):
            raise BenchError(f"{name}: page size {page_size}: Tundra volumes have 8 KiB or 16 KiB pages")
        self.page_size = page_size
        self.data_dir = self.work_dir / "tundra-data"
        self.config_file = self.work_dir / "tundra.toml"
        self.native_addr = f"127.0.0.1:{ports['native']}"
        self.drive_physical_bytes = round_down(self.size_bytes, 4096)
        self.fast_volumes_bytes = round_down(self.size_bytes // 2, page_size)
        self.volumes = {"data": (round_down(self.size_bytes, page_size), "normal")}
        if self.settings.wal_volume:
            self.volumes["wal"] = (self.fast_volumes_bytes, "none")
            self.wal_mount = self.work_dir / "mnt" / "wal"
        self._node: subprocess.Popen | None = None
        self._node_started = False   # the node made the data directory
        self._node_ready = False
        self._nbdfuse: dict[str, subprocess.Popen] = {}
        self._clean_stop: bool | None = None

    def server_pids(self) -> list[int]:
        """The processes that serve the stack's block path (their CPU is the stack's)."""
        pids = [self._node.pid] if self._node is not None and self._node.poll() is None else []
        return pids + [p.pid for p in self._nbdfuse.values() if p.poll() is None]

    def volume_file(self, vol: str) -> Path:
        """The file the node mounts a volume on (the in-process mount)."""
        return self.work_dir / "files" / vol

    def config_text(self) -> str:
        """The node's config file: listeners, sizes, both compression switches and the drive's
        deferred mode spelled out, and a `[[mount]]` per volume (which creates it) unless the
        stack goes through nbdfuse."""
        lines = ["[listen]"]
        lines += [f'{key} = "127.0.0.1:{self.ports[key]}"' for key in ("native", "nbd", "metrics")]
        lines += ["[drive]", f'physical = "{self.drive_physical_bytes}"', f'compression = "{self.settings.drive}"',
                  f'deferred = {"true" if self.settings.drive_deferred else "false"}',
                  "[fast]", f'volumes = "{self.fast_volumes_bytes}"',
                  "[compression]", f'software = "{self.settings.software}"']
        lines += list(self.settings.compression_extra)
        if self.node_cgroup is not None:
            lines += ["[cache]", f"pages = {node_cache_pages(self.page_size)}",
                      f'write_back = "{NODE_CACHE["write_back"]}"']
        if self.settings.limits_extra:
            lines += ["[limits]"] + list(self.settings.limits_extra)
        if self.settings.access == "mount":
            for vol, (size, mode) in self.volumes.items():
                lines += ["[[mount]]", f'volume = "{vol}"', f'file = "{self.volume_file(vol)}"', f'size = "{size}"',
                          f'page_size = "{self.page_size // 1024}KiB"', f'mode = "{mode}"']
        return "\n".join(lines) + "\n"

    def _check_configuration(self, stats: dict) -> dict:
        """The compression settings the node reports running with (`configuration` of `tundra
        stats --json`); BenchError unless they are the stack's."""
        running = stats.get("configuration") or {}
        wanted = {"software_compression": self.settings.software, "drive_compression": self.settings.drive,
                  "drive_deferred": self.settings.drive == "on" and self.settings.drive_deferred}
        if {k: running.get(k) for k in wanted} != wanted:
            raise BenchError(f"{self.name}: the node runs with {running or 'no configuration in its stats'}, "
                             f"not {wanted} as {self.config_file} says")
        return running

    def _tundra(self, args: list, what: str, check: bool = True, timeout: float = 60):
        return self._run([self.tundra_bin] + args, what, check=check, timeout=timeout)

    def _node_log_tail(self, n: int = 5) -> str:
        try:
            lines = (self.log_dir / "tundra.log").read_text(errors="replace").strip().splitlines()
        except FileNotFoundError:
            return "no log"
        return " | ".join(lines[-n:]) or "no output"

    def _build(self) -> None:
        if not os.access(self.tundra_bin, os.X_OK):
            raise BenchError(f"{self.tundra_bin} is not an executable tundra binary "
                             "(cargo build --release -p tundra)")
        busy = {k: self.ports[k] for k in ("native", "nbd", "metrics") if not port_free(self.ports[k])}
        if busy:
            raise BenchError("ports in use on 127.0.0.1: " + ", ".join(f"{k} {p}" for k, p in busy.items()))
        if self.data_dir.exists():
            raise BenchError(f"{self.data_dir} exists already")
        self.config_file.write_text(self.config_text())
        if self.settings.access == "mount":
            (self.work_dir / "files").mkdir(parents=True, exist_ok=True)
        self._start_node()
        self._check_configuration(self._stats())
        if self.settings.access == "nbdfuse":
            for vol, (size, mode) in self.volumes.items():
                self._tundra(["volume", "create", vol, "--size", size, "--page-size",
                              f"{self.page_size // 1024}KiB", "--mode", mode, "--addr", self.native_addr],
                             f"tundra volume create {vol}")
        for vol in self.volumes:
            fuse_file = self._start_nbdfuse(vol) if self.settings.access == "nbdfuse" else self._mounted_file(vol)
            dev = self._attach_loop(vol, fuse_file)
            # Zero-filled inode tables and journal cost nothing here (write-zeroes become trims),
            # and leave no lazy initialisation running while the stack is measured.
            self._run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev],
                      f"mkfs.ext4 on {vol}")
            self._mount(dev, self.data_mount if vol == "data" else self.wal_mount, None)

    def _start_node(self) -> None:
        with open(self.log_dir / "tundra.log", "ab") as out:
            self._node = subprocess.Popen(
                [str(self.tundra_bin), "serve", "--data-dir", str(self.data_dir), "--config", str(self.config_file)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=self.node_cgroup.preexec() if self.node_cgroup is not None else None)
        self._node_started = True
        if self.node_cgroup is not None:
            cgroups = Path(f"/proc/{self._node.pid}/cgroup").read_text().splitlines()
            memory = next((line.split(":", 2)[2] for line in cgroups if "memory" in line.split(":", 2)[1].split(",")),
                          None)
            if memory != self.node_cgroup.rel:
                raise BenchError(f"tundra serve (pid {self._node.pid}) is in memory cgroup {memory}, "
                                 f"not {self.node_cgroup.rel}")
        with open(self.log_file, "a") as f:
            f.write(f"+ {self.tundra_bin} serve --data-dir {self.data_dir} --config {self.config_file} "
                    f"(pid {self._node.pid})\n{self.config_text()}")
        deadline = time.monotonic() + NODE_START_SECONDS
        while True:
            if self._node.poll() is not None:
                raise BenchError(f"{self.tundra_bin} serve exited with status {self._node.returncode} before it "
                                 f"was ready: {self._node_log_tail()}")
            p = run([str(self.tundra_bin), "volume", "list", "--addr", self.native_addr], check=False, timeout=30)
            if p.returncode == 0:
                self._node_ready = True
                return
            if time.monotonic() > deadline:
                raise BenchError(f"tundra serve did not answer on {self.native_addr} within {NODE_START_SECONDS} s: "
                                 f"{self._node_log_tail()}")
            time.sleep(0.2)

    def _mounted_file(self, vol: str) -> Path:
        """The volume's file once the node has mounted it (it does so before it says it is
        ready, so this only checks)."""
        f = self.volume_file(vol)
        if not mounted(f):
            raise BenchError(f"{self.name}: the node did not mount {vol} on {f}: {self._node_log_tail()}")
        return f

    def _start_nbdfuse(self, vol: str) -> Path:
        """nbdfuse shows the volume's export as the file FUSE_DIR/nbd; returns that file."""
        fuse_dir = self.work_dir / "fuse" / vol
        fuse_dir.mkdir(parents=True, exist_ok=True)
        uri = f"nbd://127.0.0.1:{self.ports['nbd']}/{vol}"
        with open(self.log_dir / f"nbdfuse-{vol}.log", "ab") as out:
            # -C 5, as scripts/pg-on-tundra: nbdfuse 1.14 carries I/O on all its connections
            # but one, so this gives four; its default gives three.
            proc = subprocess.Popen(["nbdfuse", "-C", "5", str(fuse_dir), uri], stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self._nbdfuse[vol] = proc
        with open(self.log_file, "a") as f:
            f.write(f"+ nbdfuse {fuse_dir} {uri} (pid {proc.pid})\n")
        deadline = time.monotonic() + NBDFUSE_START_SECONDS
        while not (mounted(fuse_dir) and (fuse_dir / "nbd").exists()):
            if proc.poll() is not None:
                log_text = (self.log_dir / f"nbdfuse-{vol}.log").read_text(errors="replace").strip()
                raise BenchError(f"nbdfuse {fuse_dir} {uri} exited with status {proc.returncode}: "
                                 f"{' | '.join(log_text.splitlines()[-5:]) or 'no output'}")
            if time.monotonic() > deadline:
                raise BenchError(f"nbdfuse {fuse_dir} {uri}: {fuse_dir}/nbd did not appear within "
                                 f"{NBDFUSE_START_SECONDS} s")
            time.sleep(0.1)
        return fuse_dir / "nbd"

    def _settled_stats(self, timeout: float = 900) -> dict:
        """`tundra stats` once the drive's background thread has compressed every block it
        stored raw (deferred mode), so that physical bytes are what the drive keeps; BenchError
        if it has not caught up within TIMEOUT seconds."""
        deadline = time.monotonic() + timeout
        while True:
            s = self._stats()
            if s["drive"].get("deferred_pending_blocks", 0) == 0:
                return s
            if time.monotonic() > deadline:
                raise BenchError(f"{self.name}: the drive still had {s['drive']['deferred_pending_blocks']} blocks "
                                 f"to compress after {timeout:.0f} s")
            time.sleep(0.5)

    def _stats(self) -> dict:
        p = self._tundra(["stats", "--json", "--addr", self.native_addr], "tundra stats")
        try:
            return json.loads(p.stdout)
        except json.JSONDecodeError as e:
            raise BenchError(f"{self.name}: tundra stats --json printed no JSON ({e}): {p.stdout[:300]!r}") from e

    def sizes(self) -> dict:
        """From `tundra stats --json`: physical_bytes = `physical_bytes_attributed` of the data
        volume plus that of the WAL volume where there is one; data_physical_bytes and
        wal_physical_bytes those two parts (None where the WAL is on the data volume). details:
        the configuration, as set and as the node reports it (BenchError if they differ), and
        the sizes chosen; per volume its pages, logical bytes (as the filesystem wrote them),
        compressed bytes (codec output), software bytes (the 4 KiB blocks allocated after the
        software layer), physical bytes attributed, the lz4/zstd/raw/heavy page mix (counts and
        fractions of its pages, {} before any page; raw counts the pages written raw and those
        no algorithm saved a 4 KiB block on) and its ratios; `mix`, the data volume's fractions
        (seed 000 Table 3); each layer's ratio for the node
        (`software_ratio` logical over software bytes, `drive_ratio` mapped over physical bytes
        used, `ratio` both layers); the drive's space and garbage collection; write-back bytes
        not yet flushed; the host's allocation of drive.img and fast.img; the loop devices and
        their direct I/O state; the bytes the last fstrim reported."""
        s = self._settled_stats()
        running = self._check_configuration(s)
        vols = {v["name"]: v for v in s["volumes"]}
        missing = [v for v in self.volumes if v not in vols]
        if missing:
            raise BenchError(f"{self.name}: tundra stats lists no volume {', '.join(missing)}")
        per_volume = {}
        for name in self.volumes:
            v = vols[name]
            pages = v["pages"]
            mix = {k: v[f"{k}_pages"] for k in ("lz4", "zstd", "raw", "heavy")}
            per_volume[name] = {
                "mode": v["mode"], "device": v["device"], "size_bytes": v["size_bytes"], "pages": pages,
                "logical_bytes": v["logical_bytes"], "compressed_bytes": v["compressed_bytes"],
                "software_bytes": v["software_bytes"], "physical_bytes_attributed": v["physical_bytes_attributed"],
                "mix_pages": mix, "mix_fraction": {k: n / pages for k, n in mix.items()} if pages else {},
                "software_ratio": v["software_ratio"], "ratio": v["ratio"]}
        data_physical = vols["data"]["physical_bytes_attributed"]
        wal_physical = vols["wal"]["physical_bytes_attributed"] if "wal" in self.volumes else None
        details = {
            "settings": {"software": self.settings.software, "drive_compression": self.settings.drive,
                         "wal": "mode none volume" if self.settings.wal_volume else "directory on the data volume"},
            "node_configuration": running,
            "drive_physical_config_bytes": self.drive_physical_bytes,
            "fast_volumes_config_bytes": self.fast_volumes_bytes,
            "page_size": self.page_size,
            "volumes": per_volume,
            "mix": per_volume["data"]["mix_fraction"],
            "software_ratio": s["software_ratio"], "drive_ratio": s["drive_ratio"], "ratio": s["ratio"],
            "compressed": s["compressed"],
            "drive": s["drive"],
            "cpu": s.get("cpu"),
            "write_back_dirty_bytes": s["write_back_dirty_bytes"],
            "host_files_allocated_bytes": {p.name: allocated_bytes(p) for p in sorted(self.data_dir.glob("*.img"))},
            "node_memory": ({"cgroup": self.node_cgroup.rel,
                             "cache": {"pages": node_cache_pages(self.page_size), "page_size": self.page_size,
                                       "write_back": NODE_CACHE["write_back"]}} if self.node_cgroup is not None
                            else "outside the database's memory cgroup, default caches"),
            "loops": self._loop_details(),
            "fstrim_bytes": dict(self._fstrim_bytes),
        }
        return {"physical_bytes": data_physical + (wal_physical or 0),
                "data_physical_bytes": data_physical if self.settings.wal_volume else None,
                "wal_physical_bytes": wal_physical, "fs_used_bytes": self._fs_used(),
                **self._media(s["drive"], wal_physical), "details": details}

    def _media(self, drive: dict, wal_physical) -> dict:
        """The space counted as the peers' is: `live_bytes`, the drive's live records with their
        16-byte headers (`physical_live_bytes`) plus the fast device's blocks of the WAL volume;
        `allocated_bytes`, the drive's segments that are not free (garbage not yet collected
        included, `physical_allocated_bytes`) plus what the host allocated to `fast.img` (the
        journals, the redo area and the WAL volume: more than the WAL alone, counted against
        Tundra). None where the node reports no such figure."""
        live, allocated = drive.get("physical_live_bytes"), drive.get("physical_allocated_bytes")
        return {"live_bytes": None if live is None else live + (wal_physical or 0),
                "allocated_bytes": None if allocated is None else allocated + self._fast_allocated()}

    def _fast_allocated(self) -> int:
        """The host's blocks of the node's fast device file (0 before it exists)."""
        fast = self.data_dir / "fast.img"
        return allocated_bytes(fast) if fast.exists() else 0

    def teardown(self) -> None:
        """Unmounts the filesystems, detaches the loop devices, unmounts the FUSE files and
        stops nbdfuse (the `-nbdfuse` stacks), stops the node (SIGTERM, by its PID; it unmounts
        its own files), in that order; the node's data
        directory stays for `post_check`. Raises BenchError listing whatever could not be undone
        (after trying everything)."""
        problems: list[str] = []
        self._unmount_all(problems)
        if not self._mounts:
            self._detach_loops(problems)
        for vol, proc in list(self._nbdfuse.items()):
            fuse_dir = self.work_dir / "fuse" / vol
            # The loop device lets go of the file asynchronously: retry, then detach lazily.
            for _ in range(50):
                if not mounted(fuse_dir):
                    break
                if not self._attempt(["umount", fuse_dir], f"umount {fuse_dir}", problems):
                    time.sleep(0.1)
            if mounted(fuse_dir):
                self._attempt(["umount", "-l", fuse_dir], f"umount -l {fuse_dir}", problems)
                problems.append(f"{fuse_dir} stayed busy: unmounted lazily")
            # nbdfuse exits once its mount is gone.
            for _ in range(50):
                if proc.poll() is not None:
                    break
                time.sleep(0.1)
            stop_pid(proc.pid, f"nbdfuse for {vol}", timeout=10)
            del self._nbdfuse[vol]
        if self._node is not None:
            stop_pid(self._node.pid, "tundra serve", timeout=NODE_STOP_SECONDS)
            self._clean_stop = "stopped cleanly" in self._node_log_tail(3)
            if pid_alive(self._node.pid):
                problems.append(f"tundra serve (pid {self._node.pid}) is still running")
            else:
                self._node = None
        for vol in self.volumes:
            f = self.volume_file(vol)
            if self.settings.access == "mount" and mounted(f):
                # A node that died leaves its mount behind, its server gone.
                self._attempt(["umount", "-l", f], f"umount -l {f}", problems)
                problems.append(f"{f} was still mounted after the node stopped")
        if problems:
            raise BenchError(f"{self.name}: teardown: " + "; ".join(problems))

    def post_check(self) -> dict:
        """After teardown: `tundra fsck --data-dir` (every page of both stores read and checked
        against its checksum, every block referenced once, nothing mapped unreferenced), then the
        data directory is removed. Returns {"fsck": "clean"}, or {"fsck": "not run: ..."} when the
        node never started; raises BenchError with the damage fsck lists, or when the node did
        not stop cleanly."""
        if self._node is not None or self._nbdfuse or self._mounts or self._loops:
            raise BenchError(f"{self.name}: post_check needs the stack torn down first")
        if not self._node_ready:
            if self._node_started:
                self._remove_data_dir()
            return {"fsck": "not run: the node never started"}
        p = self._tundra(["fsck", "--data-dir", self.data_dir, "--json"], "tundra fsck", check=False,
                         timeout=COMMAND_SECONDS)
        (self.log_dir / "tundra-fsck.json").write_text(p.stdout + p.stderr)
        try:
            report = json.loads(p.stdout)
        except json.JSONDecodeError:
            raise BenchError(f"{self.name}: tundra fsck --data-dir {self.data_dir} exited {p.returncode} "
                             f"without a report: {(p.stderr or p.stdout).strip()[-400:]}") from None
        if not report.get("clean"):
            damaged = [f"{st['device']}: {line}" for st in report.get("stores", []) for line in st.get("damaged", [])]
            raise BenchError(f"{self.name}: tundra fsck found {len(damaged)} problem(s) (data directory left in "
                             f"{self.data_dir}): " + "; ".join(damaged[:20]))
        after_gc = self._collect_garbage()
        self._remove_data_dir()
        if not self._clean_stop:
            raise BenchError(f"{self.name}: the node did not stop cleanly (its log does not end with "
                             f"'stopped cleanly'; fsck clean): {self._node_log_tail()}")
        return {"fsck": "clean", "after_gc": after_gc}

    def _collect_garbage(self) -> dict:
        """The stopped node's drive collected to the end (`tundra drive gc`, every sealed segment
        that frees at least one maximal record), so that its allocated media count like a
        trimmed filesystem's: `allocated_bytes` is the drive's segments still allocated plus
        what the host allocated to `fast.img`; `live_bytes` the drive's live records with their
        headers (the WAL volume's blocks on the fast device are not in it: the stopped node
        cannot say which they are; the measurement before teardown has them)."""
        drive = self.data_dir / "drive.img"
        gc = self._tundra(["drive", "gc", drive], "tundra drive gc", timeout=COMMAND_SECONDS)
        p = self._tundra(["drive", "stats", drive, "--json"], "tundra drive stats", timeout=COMMAND_SECONDS)
        try:
            st = json.loads(p.stdout)
        except json.JSONDecodeError as e:
            raise BenchError(f"{self.name}: tundra drive stats --json printed no JSON ({e}): {p.stdout[:300]!r}") from e
        fast_allocated = self._fast_allocated()
        return {"gc": gc.stdout.strip(), "drive_live_bytes": st["physical_live_bytes"],
                "drive_allocated_bytes": st["physical_allocated_bytes"], "fast_allocated_bytes": fast_allocated,
                "live_bytes": st["physical_live_bytes"],
                "allocated_bytes": st["physical_allocated_bytes"] + fast_allocated}

    def _remove_data_dir(self) -> None:
        if self.data_dir.exists():
            if mounts_under(self.work_dir):
                raise BenchError(f"{self.name}: left {self.data_dir} in place: "
                                 f"{', '.join(mounts_under(self.work_dir))} still mounted")
            run(["rm", "-rf", "--one-file-system", str(self.data_dir)], what=f"{self.name}: removing {self.data_dir}",
                log_file=self.log_file)

    def versions(self) -> dict:
        v = super().versions()
        digest = hashlib.sha256(self.tundra_bin.read_bytes()).hexdigest()[:16] if self.tundra_bin.exists() else None
        v.update({"tundra": first_line([str(self.tundra_bin), "--version"]), "tundra_sha256": digest,
                  "access": self.settings.access, "e2fsprogs": first_line(["mkfs.ext4", "-V"])})
        if self.settings.access == "nbdfuse":
            v["nbdfuse"] = first_line(["nbdfuse", "--version"])
        return v


class NullFuseStack(Stack):
    """`fuse-null`: each volume of `tundra-off` (data, and a WAL half its size) as a plain host
    file behind the in-process FUSE export (`tundra bench null-export`, one process per file),
    then a loop device (direct I/O) and ext4 made as on the Tundra stacks: the block path with
    the store taken out."""

    def __init__(self, name: str, *, tundra_bin: Path, **kw):
        super().__init__(name, **kw)
        self.tundra_bin = Path(tundra_bin)
        self.compresses = False
        self.volumes = {"data": round_down(self.size_bytes, 4096), "wal": round_down(self.size_bytes // 2, 4096)}
        self.wal_mount = self.work_dir / "mnt" / "wal"
        self._exports: dict[str, subprocess.Popen] = {}

    def volume_file(self, vol: str) -> Path:
        return self.work_dir / "files" / vol

    def backing_file(self, vol: str) -> Path:
        return self.work_dir / "backing" / f"{vol}.img"

    def server_pids(self) -> list[int]:
        return [p.pid for p in self._exports.values() if p.poll() is None]

    def _build(self) -> None:
        if not os.access(self.tundra_bin, os.X_OK):
            raise BenchError(f"{self.tundra_bin} is not an executable tundra binary "
                             "(cargo build --release -p tundra)")
        (self.work_dir / "files").mkdir(parents=True, exist_ok=True)
        (self.work_dir / "backing").mkdir(parents=True, exist_ok=True)
        for vol, size in self.volumes.items():
            f = self.volume_file(vol)
            cmd = [str(self.tundra_bin), "bench", "null-export", "--file", str(f), "--size", str(size),
                   "--backing", str(self.backing_file(vol))]
            with open(self.log_dir / f"null-export-{vol}.log", "ab") as out:
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            self._exports[vol] = proc
            with open(self.log_file, "a") as lf:
                lf.write(f"+ {' '.join(cmd)} (pid {proc.pid})\n")
            deadline = time.monotonic() + NODE_START_SECONDS
            while not mounted(f):
                if proc.poll() is not None:
                    text = (self.log_dir / f"null-export-{vol}.log").read_text(errors="replace").strip()
                    raise BenchError(f"tundra bench null-export for {vol} exited with status {proc.returncode}: "
                                     f"{' | '.join(text.splitlines()[-5:]) or 'no output'}")
                if time.monotonic() > deadline:
                    raise BenchError(f"tundra bench null-export did not mount {f} within {NODE_START_SECONDS} s")
                time.sleep(0.1)
            dev = self._attach_loop(vol, f)
            self._run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", dev],
                      f"mkfs.ext4 on {vol}")
            self._mount(dev, self.data_mount if vol == "data" else self.wal_mount, None)

    def sizes(self) -> dict:
        physical = sum(allocated_bytes(self.backing_file(v)) for v in self.volumes if self.backing_file(v).exists())
        fs_used = self._fs_used()
        return {"physical_bytes": physical, "data_physical_bytes": None, "wal_physical_bytes": None,
                "fs_used_bytes": fs_used, "live_bytes": fs_used, "allocated_bytes": physical,
                "details": {"loops": self._loop_details(), "fstrim_bytes": dict(self._fstrim_bytes)}}

    def teardown(self) -> None:
        """Unmounts ext4, detaches the loop devices, stops each export (SIGTERM, by its PID; it
        unmounts its own file), removes the backing files."""
        problems: list[str] = []
        self._unmount_all(problems)
        if not self._mounts:
            self._detach_loops(problems)
        for vol, proc in list(self._exports.items()):
            stop_pid(proc.pid, f"tundra bench null-export for {vol}", timeout=NODE_STOP_SECONDS)
            if pid_alive(proc.pid):
                problems.append(f"tundra bench null-export (pid {proc.pid}) is still running")
                continue
            del self._exports[vol]
            if mounted(self.volume_file(vol)):
                self._attempt(["umount", "-l", self.volume_file(vol)], f"umount -l {self.volume_file(vol)}", problems)
                problems.append(f"{self.volume_file(vol)} was still mounted after its export stopped")
        if not self._exports and not mounts_under(self.work_dir):
            for vol in self.volumes:
                self.backing_file(vol).unlink(missing_ok=True)
        if problems:
            raise BenchError(f"{self.name}: teardown: " + "; ".join(problems))


def round_down(n: int, unit: int) -> int:
    """N rounded down to a multiple of UNIT."""
    return n // unit * unit


def make_stack(name: str, *, work_dir: Path, size_bytes: int, tundra_bin: Path, ports: dict, log_dir: Path,
               page_size: int = 8192, node_cgroup=None) -> Stack:
    """The stack NAME (a key of STACKS), not yet set up. PORTS ({"nbd", "native", "metrics"})
    are used by the Tundra stacks only, and so is NODE_CGROUP (a common.MemoryCgroup): given,
    the node runs inside it, with the caches of NODE_CACHE."""
    shared = dict(work_dir=Path(work_dir), size_bytes=size_bytes, log_dir=Path(log_dir))
    if name in LOOP_FILESYSTEMS:
        return LoopFsStack(name, **shared)
    if name == "fuse-null":
        return NullFuseStack(name, tundra_bin=Path(tundra_bin), **shared)
    if name in TUNDRA_SETTINGS:
        missing = [k for k in ("nbd", "native", "metrics") if k not in ports]
        if missing:
            raise BenchError(f"{name}: no port given for {', '.join(missing)}")
        return TundraStack(name, tundra_bin=Path(tundra_bin), ports=ports, page_size=page_size,
                           node_cgroup=node_cgroup, **shared)
    raise BenchError(f"unknown stack {name!r} (one of: {', '.join(STACKS)})")


# --- self-test --------------------------------------------------------------------------------

PHRASES = ("carefully final deposits detect slyly", "furiously regular accounts", "pending requests sleep quickly",
           "ironic packages boost blithely", "express foxes haggle", "bold theodolites among special instructions",
           "wake fluffily even pinto beans", "unusual dependencies nag quietly", "silent platelets cajole",
           "closely busy excuses integrate", "blithely final asymptotes", "quickly express ideas")


def sample_text(n_bytes: int, seed: int) -> bytes:
    """N_BYTES of CSV rows (key, date, status, clerk, amount, a comment of stock phrases), like a
    database table's text. In 8 KiB pages lz4 compresses it about 3x and zstd about 5x (`tundra
    analyze`), so either algorithm saves 4 KiB blocks, whichever Algorithm 1 picks."""
    rng = random.Random(seed)
    rows, size, key = [], 0, seed * 10_000_000
    while size < n_bytes:
        key += 1
        row = (f"{key},1995-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d},"
               f"{rng.choice(('OPEN', 'SHIPPED', 'RETURNED'))},Clerk#{rng.randrange(1000):05d},"
               f"{rng.randrange(100000) / 100:.2f},{' '.join(rng.choices(PHRASES, k=rng.randint(1, 3)))}\n")
        rows.append(row)
        size += len(row)
    return "".join(rows).encode()[:n_bytes]


def write_synced(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def free_ports(start: int) -> dict:
    ports, port = {}, start
    for key in ("nbd", "native", "metrics"):
        while not port_free(port):
            port += 1
        ports[key] = port
        port += 1
    return ports


def selftest_one(name: str, *, root: Path, size_bytes: int, tundra_bin: Path, ports: dict,
                 files: list[bytes], wal_data: bytes) -> dict:
    """Sets NAME up, writes FILES into its data mount and WAL_DATA into its WAL mount (each
    fsynced), trims, measures, tears down, checks; returns the sizes and what was checked.
    Raises BenchError when a step or a check fails (the stack taken down first)."""
    work, logs = root / name, root / "logs" / name
    stack = make_stack(name, work_dir=work, size_bytes=size_bytes, tundra_bin=tundra_bin, ports=ports,
                       log_dir=logs)
    t0 = time.monotonic()
    stack.setup()
    try:
        setup_seconds = time.monotonic() - t0
        for m in (stack.data_mount, stack.wal_mount):
            if not mounted(m):
                raise BenchError(f"{name}: {m} is not a mount point after setup")
        if isinstance(stack, TundraStack) and (stack.wal_mount == stack.data_mount) == stack.settings.wal_volume:
            raise BenchError(f"{name}: the WAL's mount does not match the configuration")
        for i, data in enumerate(files):
            write_synced(stack.data_mount / "db" / f"table-{i}.csv", data)
        write_synced(stack.wal_mount / "wal" / "segment-0001", wal_data)
        stack.trim()
        sizes = stack.sizes()
        versions = stack.versions()
    finally:
        stack.teardown()
    post = stack.post_check()
    left = mounts_under(work) + loops_under(work)
    if left:
        raise BenchError(f"{name}: left behind after teardown: {', '.join(left)}")
    leftover_files = [str(p) for p in work.rglob("*") if p.is_file()
                      and (p.suffix == ".img" or "tundra-data" in p.parts)]
    if leftover_files:
        raise BenchError(f"{name}: teardown/post_check left files: {', '.join(leftover_files[:5])}")
    if isinstance(stack, TundraStack) and post != {"fsck": "clean"}:
        raise BenchError(f"{name}: post_check returned {post}")
    if not isinstance(stack, TundraStack) and post != {}:
        raise BenchError(f"{name}: post_check returned {post}")
    return {"name": name, "compresses": stack.compresses, "setup_seconds": setup_seconds, "sizes": sizes,
            "post_check": post, "versions": versions}


def summary(r: dict, written: int) -> str:
    """One line per stack: its sizes and what explains them."""
    s = r["sizes"]
    d = s["details"]

    def mib(n):
        return "—" if n is None else f"{n / 2**20:7.1f}"
    parts = [f"{r['name']:30} physical {mib(s['physical_bytes'])} MiB (data {mib(s['data_physical_bytes'])}, "
             f"WAL {mib(s['wal_physical_bytes'])}), fs used {mib(s['fs_used_bytes'])} MiB, "
             f"written/physical {written / s['physical_bytes']:.2f}"]
    dio = ",".join(f"{n}={'on' if lp['dio'] else 'OFF'}" for n, lp in d["loops"].items())
    parts.append(f"dio {dio}")
    if "compsize" in d and "disk_bytes" in d["compsize"]:
        parts.append(f"compsize {mib(d['compsize']['disk_bytes']).strip()}/"
                     f"{mib(d['compsize']['uncompressed_bytes']).strip()} MiB")
    if "volumes" in d:
        v = d["volumes"]["data"]
        mix = "/".join(f"{k} {n}" for k, n in v["mix_pages"].items())
        parts.append(f"data pages {v['pages']} ({mix}), software ratio {d['software_ratio']:.2f}, "
                     f"drive ratio {d['drive_ratio']:.2f}, both {d['ratio']:.2f}")
    return "; ".join(parts)


def selftest(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.eval.stacks selftest",
                                description="Builds, fills, measures and takes down every stack.")
    p.add_argument("--stacks", type=lambda s: s.split(","), default=list(STACKS),
                   help="comma-separated stack names (default: all, in report order)")
    p.add_argument("--size", default="1GiB", help="each stack's size (default 1GiB)")
    p.add_argument("--data", default="64MiB", help="text written into the data mount (default 64MiB)")
    p.add_argument("--tundra", default=str(REPO / "target" / "release" / "tundra"), help="the tundra binary")
    p.add_argument("--work-dir", default="/tmp", help="where the stacks are built (default /tmp)")
    a = p.parse_args(argv)
    unknown = [n for n in a.stacks if n not in STACKS]
    if unknown:
        p.error(f"unknown stack(s) {', '.join(unknown)} (one of: {', '.join(STACKS)})")
    if os.geteuid() != 0:
        p.error("needs root (loop devices, mounts)")
    names = [n for n in STACKS if n in a.stacks]
    root = Path(a.work_dir).resolve() / f"tundra-stacks-selftest.{os.getpid()}"
    root.mkdir(parents=True)
    root.chmod(0o755)
    tundra_bin = Path(a.tundra)
    if any(n in TUNDRA_SETTINGS for n in names):
        # A private copy: a rebuild during the run does not change the binary under test.
        (root / "bin").mkdir()
        shutil.copy2(tundra_bin, root / "bin" / "tundra")
        tundra_bin = root / "bin" / "tundra"
    chunk = parse_size(a.data) // 8
    files = [sample_text(chunk, seed) for seed in range(8)]
    wal_data = sample_text(4 << 20, 99)
    written = sum(map(len, files)) + len(wal_data)
    log(f"self-test of {', '.join(names)} at {a.size} each; {written / 2**20:.0f} MiB written per stack; in {root}")
    results, failures = [], []
    for name in names:
        log(f"{name}: {STACKS[name]}")
        try:
            r = selftest_one(name, root=root, size_bytes=parse_size(a.size), tundra_bin=tundra_bin,
                             ports=free_ports(22000 + os.getpid() % 1000 * 10), files=files, wal_data=wal_data)
        except BenchError as e:
            failures.append(str(e))
            log(f"{name}: FAILED: {e}")
            continue
        phys = r["sizes"]["physical_bytes"]
        ext4 = next((x["sizes"]["physical_bytes"] for x in results if x["name"] == "ext4"), None)
        if r["compresses"]:
            bound, what = (ext4, "ext4's") if ext4 is not None else (written, "the bytes written")
            if not written / 30 < phys < bound:
                failures.append(f"{name}: physical {phys} B is not between 1/30 of the bytes written and {what} "
                                f"{bound} B")
        elif phys < written * 0.9:
            failures.append(f"{name}: physical {phys} B is less than the {written} B written, uncompressed")
        results.append(r)
        print(summary(r, written), flush=True)
        (root / "logs" / name / "result.json").write_text(json.dumps(r, indent=1))
    for f in failures:
        print(f"FAILED: {f}", flush=True)
    if failures:
        log(f"{len(failures)} failure(s); logs kept in {root}/logs")
        return 1
    if mounts_under(root) or loops_under(root):
        log(f"left in place: {root} (still in use)")
        return 1
    run(["rm", "-rf", "--one-file-system", str(root)], what="removing the self-test's directory")
    log(f"all {len(results)} stack(s) passed")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "selftest":
        print("usage: python -m bench.eval.stacks selftest [--stacks a,b,...] [--size 1GiB] [--data 64MiB] "
              "[--tundra PATH] [--work-dir DIR]", file=sys.stderr)
        return 2
    return selftest(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
