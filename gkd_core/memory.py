"""Memory: a process's limit and how near it is, read from the cgroup filesystem and /proc (Linux).

The kernel's OOM killer acts on a cgroup's limit (a container's, a Slurm job's, a systemd unit's): the
processes under it together, not one process's size. So a heartbeat says the scope that limits the
process (the nearest cgroup up its tree with a finite limit, else the node), that scope's use and limit,
and how many times the OOM killer has acted in it so far; the diagnosis learns each scope's growth and
names who grows. cgroup v2 (``memory.max``, ``memory.current``, ``memory.events``' ``oom_kill``) and v1
(``memory.limit_in_bytes``, ``memory.usage_in_bytes``, ``memory.oom_control``'s ``oom_kill``), found through
``/proc/self/cgroup`` and ``/proc/self/mountinfo``; where neither limits it, the node's MemTotal and
MemAvailable (``/proc/meminfo``). Every read goes through ``read`` (path -> text, or None), so a test
gives it fixture files.

Nothing here raises: what cannot be read is unknown (0, None).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

# cgroup v1 says "no limit" as PAGE_COUNTER_MAX (9223372036854771712, 2^63 rounded to pages); v2 as "max".
# A limit beyond any machine's memory is none.
NO_LIMIT = 1 << 60
RESOLVE_EVERY_S = 30.0  # a process's cgroup is looked up again this often (a job moved into another is rare)

Read = Callable[[str], "str | None"]


def read_file(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


class KeptOpen:
    """A reader that keeps each file open and reads it again from its start (``pread``): /proc's and the
    cgroup filesystem's files are made anew at each read from offset 0, and an open, read and close of one
    costs ten to twenty times the read alone (bench/bench_memory.py). A file that fails is opened again
    at its next read."""

    SIZE = 16384  # /proc/vmstat is about 4 KB; the others, a line or a few

    def __init__(self):
        self._fds: dict[str, int] = {}

    def __call__(self, path: str) -> str | None:
        fd = self._fds.get(path)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            return os.pread(fd, self.SIZE, 0).decode(errors="replace")
        except OSError:
            if fd is not None:
                self._fds.pop(path, None)
                with contextlib.suppress(OSError):
                    os.close(fd)
            return None

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


@dataclass(frozen=True)
class Cgroup:
    """A process's memory cgroup: its version (1 or 2), its folder, and the hierarchy's mount point (the
    walk up the tree stops there)."""

    version: int
    dir: str
    mount: str


def find_cgroup(cgroup_text: str, mountinfo_text: str) -> Cgroup | None:
    """The memory cgroup of the process whose ``/proc/PID/cgroup`` and ``/proc/PID/mountinfo`` these are.
    A v1 memory controller wins over v2 (a hybrid host mounts both, and the memory controller is on one)."""
    v1_path = v2_path = None
    for line in cgroup_text.splitlines():
        num, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if num == "0" and controllers == "":
            v2_path = path
        elif "memory" in controllers.split(","):
            v1_path = path
    mounts = []  # (fstype, root in the hierarchy, mount point, super options)
    for line in mountinfo_text.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        pre, _, post = line.partition(" - ")
        post_fields = post.split()
        if len(post_fields) < 3:
            continue
        pre_fields = pre.split()
        mounts.append((post_fields[0], pre_fields[3], _unescape(pre_fields[4]), post_fields[2]))
    if v1_path is not None:
        for fstype, root, point, options in mounts:
            if fstype == "cgroup" and "memory" in options.split(","):
                return Cgroup(1, _join(point, root, v1_path), point)
    if v2_path is not None:
        for fstype, root, point, _ in mounts:
            if fstype == "cgroup2":
                return Cgroup(2, _join(point, root, v2_path), point)
    return None


def _unescape(path: str) -> str:
    """mountinfo writes a space in a path as \\040 (and tab, newline, backslash alike)."""
    return path.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def _join(point: str, root: str, path: str) -> str:
    """The folder of cgroup ``path`` under a mount of the hierarchy at ``root`` (a container sees its own
    cgroup as "/" where the mount's root is its cgroup: the path is relative to that root)."""
    rel = path
    if root != "/" and (path == root or path.startswith(root.rstrip("/") + "/")):
        rel = path[len(root):]
    return os.path.normpath(point + "/" + rel.lstrip("/"))


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if text == "max":
        return NO_LIMIT
    try:
        return int(text)
    except ValueError:
        return None


def _keyed(text: str | None, key: str) -> int | None:
    """``key N`` from a flat keyed file (memory.events, memory.oom_control, /proc/meminfo's "Key: N kB")."""
    for line in (text or "").splitlines():
        name, _, value = line.partition(" ")
        if name.rstrip(":") == key:
            try:
                return int(value.split()[0])
            except (ValueError, IndexError):
                return None
    return None


@dataclass(frozen=True)
class Limit:
    """The scope that limits a process: where (a cgroup's folder, or "node"), its limit and use in bytes, and
    the OOM killer's kills in it so far (None where that is not counted: the node, an old kernel)."""

    where: str
    limit: int
    used: int
    oom_kills: int | None


def cgroup_limit(cg: Cgroup, read: Read = read_file) -> Limit | None:
    """The nearest cgroup from ``cg`` up to its hierarchy's root with a finite memory limit."""
    limit_file, used_file = ("memory.max", "memory.current") if cg.version == 2 else \
        ("memory.limit_in_bytes", "memory.usage_in_bytes")
    d = cg.dir
    while True:
        limit = _number(read(f"{d}/{limit_file}"))
        if limit is not None and limit < NO_LIMIT:
            used = _number(read(f"{d}/{used_file}")) or 0
            kills = _keyed(read(f"{d}/memory.events"), "oom_kill") if cg.version == 2 else \
                _keyed(read(f"{d}/memory.oom_control"), "oom_kill")
            return Limit(d, limit, used, kills)
        if d == cg.mount or len(d) <= len(cg.mount) or d == "/":
            return None
        d = os.path.dirname(d)


def oom_kills(scope: str, read: Read = read_file) -> int | None:
    """The OOM killer's kills so far in a scope a heartbeat named: a cgroup's folder (v2's memory.events, else
    v1's memory.oom_control), or "node" (/proc/vmstat, Linux 4.13 and later)."""
    if scope == "node":
        text = read("/proc/vmstat") or ""
        at = text.find("\noom_kill ")  # one line of about 150: found, not split
        return _number(text[at + 10:text.find("\n", at + 10)]) if at >= 0 else None
    found = _keyed(read(f"{scope}/memory.events"), "oom_kill")
    return found if found is not None else _keyed(read(f"{scope}/memory.oom_control"), "oom_kill")


def node_memory(read: Read = read_file) -> tuple[int, int] | None:
    """(MemTotal, MemAvailable) in bytes, from /proc/meminfo."""
    text = read("/proc/meminfo")
    total, available = _keyed(text, "MemTotal"), _keyed(text, "MemAvailable")
    if total is None or available is None:
        return None
    return total * 1024, available * 1024


class MemoryProbe:
    """What a heartbeat says of memory, for one process: its scope's limit and use, and the node's available
    memory. Which cgroup limits it (and that limit) is found once and again every RESOLVE_EVERY_S; between,
    a sample reads its use and its kills (two one-line files), /proc/meminfo's head and, for the node's
    kills, /proc/vmstat at most every NODE_KILLS_EVERY_S. Every file is kept open (KeptOpen)."""

    NODE_KILLS_EVERY_S = 5.0

    def __init__(self, pid: int | str = "self", read: Read | None = None):
        self.pid = pid
        self.read = read if read is not None else KeptOpen()
        self._limit: Limit | None = None  # the cgroup that limits it, as last resolved (its use: stale)
        self._version = 0
        self._resolved = float("-inf")
        self._node_kills: int | None = None
        self._node_kills_at = float("-inf")

    def _resolve(self) -> None:
        self._resolved = time.monotonic()
        cgroup_text = read_file(f"/proc/{self.pid}/cgroup") if isinstance(self.read, KeptOpen) else \
            self.read(f"/proc/{self.pid}/cgroup")
        mountinfo_text = read_file(f"/proc/{self.pid}/mountinfo") if isinstance(self.read, KeptOpen) else \
            self.read(f"/proc/{self.pid}/mountinfo")
        cg = find_cgroup(cgroup_text or "", mountinfo_text or "") if cgroup_text else None
        self._limit = cgroup_limit(cg, self.read) if cg is not None else None
        self._version = cg.version if cg is not None else 0

    def _cgroup_now(self) -> Limit | None:
        if time.monotonic() - self._resolved >= RESOLVE_EVERY_S:
            self._resolve()
            return self._limit
        found = self._limit
        if found is None:
            return None
        used_file, kills_file, key = (("memory.current", "memory.events", "oom_kill") if self._version == 2 else
                                      ("memory.usage_in_bytes", "memory.oom_control", "oom_kill"))
        used = _number(self.read(f"{found.where}/{used_file}"))
        if used is None:  # the cgroup is gone (the job moved, a container's end): found again next time
            self._resolved = float("-inf")
            return None
        return Limit(found.where, found.limit, used, _keyed(self.read(f"{found.where}/{kills_file}"), key))

    def _node_oom_kills(self) -> int | None:
        if time.monotonic() - self._node_kills_at >= self.NODE_KILLS_EVERY_S:
            self._node_kills_at = time.monotonic()
            self._node_kills = oom_kills("node", self.read)
        return self._node_kills

    def sample(self) -> tuple[Limit | None, int]:
        """(the scope that limits this process, the node's available bytes; 0 unknown)."""
        node = node_memory(self.read)
        limit = self._cgroup_now()
        if node is not None:
            total, available = node
            if limit is None or limit.limit >= total:  # a cgroup's limit past the node's memory limits nothing
                limit = Limit("node", total, total - available, self._node_oom_kills())
        return limit, node[1] if node is not None else 0
