"""What every part of the evaluation harness shares: running commands, logging, sizes,
memory cgroups, caches and ports.

The harness runs as root on one machine. Everything it starts listens on 127.0.0.1, is stopped
by the PID it recorded, and every mount, loop device and cgroup it makes is undone by the code
that made it.
"""
from __future__ import annotations

import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
_STARTED = time.monotonic()


class BenchError(Exception):
    """A step of the harness failed; the message says which and why."""


def log(msg: str) -> None:
    elapsed = int(time.monotonic() - _STARTED)
    print(f"bench: [{elapsed // 3600:02d}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}] {msg}",
          file=sys.stderr, flush=True)


def run(cmd: list[str], *, what: str | None = None, check: bool = True, input: str | None = None,
        log_file: pathlib.Path | None = None, timeout: float | None = None,
        env: dict | None = None, user: str | None = None) -> subprocess.CompletedProcess:
    """Runs CMD, capturing its output (also appended to LOG_FILE when given). With CHECK, a
    non-zero exit raises BenchError naming WHAT (or the command) and the output's last lines.
    USER runs it as that user through runuser."""
    if user is not None:
        cmd = ["runuser", "-u", user, "--"] + list(cmd)
    full_env = None
    if env:
        full_env = dict(os.environ)
        full_env.update(env)
    try:
        p = subprocess.run(cmd, text=True, capture_output=True, input=input, timeout=timeout,
                           env=full_env)
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"{what or cmd[0]} timed out after {timeout} s: {shlex.join(cmd)}") from e
    except FileNotFoundError as e:
        raise BenchError(f"{what or cmd[0]}: {cmd[0]} is not installed (scripts/install-deps)") from e
    if log_file is not None:
        with open(log_file, "a") as f:
            f.write(f"+ {shlex.join(cmd)}\n{p.stdout}{p.stderr}")
            if p.returncode != 0:
                f.write(f"(exit {p.returncode})\n")
    if check and p.returncode != 0:
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-5:])
        raise BenchError(f"{what or cmd[0]} failed (exit {p.returncode}): {shlex.join(cmd)}: "
                         f"{tail or 'no output'}")
    return p


def parse_size(text: str) -> int:
    """'8GiB', '512MiB', '4096', '1.5GiB' -> bytes."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]i?B?|B)?\s*", text, re.I)
    if not m:
        raise BenchError(f"not a size: {text!r} (e.g. 512MiB, 8GiB)")
    unit = (m.group(2) or "B").upper().rstrip("B").rstrip("I")
    factor = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[unit]
    return int(float(m.group(1)) * factor)


def mib(n: float | None) -> str:
    return "—" if n is None else f"{n / (1 << 20):,.1f} MiB"


def allocated_bytes(path: pathlib.Path) -> int:
    """Bytes the host filesystem allocates to PATH (st_blocks), i.e. what a sparse image costs."""
    return os.stat(path).st_blocks * 512


def tree_bytes(path: pathlib.Path) -> int:
    """Sum of the apparent sizes of the regular files under PATH (symlinks not followed)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            if not os.path.islink(os.path.join(root, name)):
                total += st.st_size
    return total


def drop_caches() -> None:
    """Writes dirty pages back and drops the host page cache, so the next phase reads storage."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_pid(pid: int, what: str, timeout: float = 60.0) -> None:
    """SIGTERM, wait up to TIMEOUT, then SIGKILL: a process the harness started, by its PID."""
    if not pid_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    log(f"warning: {what} (pid {pid}) ignored SIGTERM for {timeout:.0f} s: SIGKILL")
    os.kill(pid, signal.SIGKILL)


def is_mountpoint(path: pathlib.Path) -> bool:
    return os.path.ismount(path)


class MemoryCgroup:
    """A child memory cgroup (v1) of this process's own, with a limit that includes the page
    cache. Databases are started inside it so that they really read from storage; nothing is
    ever moved out of another cgroup."""

    def __init__(self, name: str, limit_bytes: int, parent: "MemoryCgroup | None" = None):
        if parent is not None:
            # A child: the parent's limit covers it and its siblings together (v1 hierarchy).
            self.path, self.rel, self.limit_bytes = parent.path / name, f"{parent.rel}/{name}", limit_bytes
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            return
        rel = None
        for line in pathlib.Path("/proc/self/cgroup").read_text().splitlines():
            _id, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                rel = path
                break
        if rel is None:
            raise BenchError("no cgroup v1 memory controller in /proc/self/cgroup")
        base = pathlib.Path("/sys/fs/cgroup/memory" + rel.rstrip("/"))
        if not os.access(base, os.W_OK):
            raise BenchError(f"{base} (this process's memory cgroup) is not writable")
        self.path = base / f"tundra-bench.{os.getpid()}.{name}"
        self.rel = rel.rstrip("/") + "/" + self.path.name
        self.path.mkdir()
        self.limit_bytes = limit_bytes
        (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))

    def preexec(self):
        """A preexec_fn for subprocess.Popen that puts the child into this cgroup before exec."""
        procs = str(self.path / "cgroup.procs")

        def enter():
            with open(procs, "w") as f:
                f.write(str(os.getpid()))
        return enter

    # Another cgroup whose peak is reset and reported with this one's (a Tundra node's, beside
    # the database's budget).
    companion: "MemoryCgroup | None" = None

    def reset_peak(self) -> None:
        for name in ("memory.max_usage_in_bytes", "memory.failcnt"):
            try:
                (self.path / name).write_text("0")
            except OSError:
                pass
        if self.companion is not None:
            self.companion.reset_peak()

    def usage(self) -> dict:
        def read(name: str) -> int | None:
            try:
                return int((self.path / name).read_text())
            except (OSError, ValueError):
                return None
        usage = {"max_usage_bytes": read("memory.max_usage_in_bytes"),
                 "limit_hits": read("memory.failcnt"), "limit_bytes": self.limit_bytes}
        if self.companion is not None:
            usage["node"] = self.companion.usage()
        return usage

    def oom_kills(self) -> int:
        """How many processes the OOM killer has killed in this cgroup (`oom_kill` of
        memory.oom_control; 0 where the kernel does not count them)."""
        try:
            for line in (self.path / "memory.oom_control").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            pass
        return 0

    def remove(self) -> None:
        """Removes the cgroup; its processes must have exited (the caller stops them first)."""
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        tasks = (self.path / "cgroup.procs").read_text().split()
        log(f"warning: could not remove cgroup {self.path} (tasks: {' '.join(tasks)})")
