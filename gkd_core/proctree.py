"""A process and the processes it started, read from /proc (Linux; elsewhere: no children).

An inference engine does its work in child processes: vLLM's ``EngineCore`` and its workers run
the model while the rollout worker that owns them waits on a queue. So a stack of the worker
alone shows a wait, and its CPU alone reads ~0 % while the engine is busy: both would say "stuck"
of a process whose engine is working. Its children's stacks and CPU belong with it.

Not Ray's own processes: a driver that calls ``ray.init()`` starts a local cluster as its children
(the GCS, the raylet and, under the raylet, every worker). They are the cluster, not the driver's
work, and each worker reports for itself.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

CHILDREN_MAX = 16  # a worker's engine is a few processes; a data loader with hundreds is cut here
# Ray's processes: its workers retitle themselves "ray::…"; the GCS, raylet, dashboard and monitors
# run from the ray package
RAY_OWN = re.compile(r"^ray::|/ray/(?:core|dashboard|autoscaler|_private)/")


def _read(path: str) -> str:
    """A small /proc file whole: open, read and close by the os module (a tenth of what pathlib's read_text
    costs, which a heartbeat pays once for each of a Ray worker's dozens of threads)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


def children(pid: int) -> list[int]:
    """The direct children of ``pid``: each thread's, as /proc lists them per thread."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tasks:
        try:
            out += [int(c) for c in _read(f"/proc/{pid}/task/{tid}/children").split()]
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile, or a kernel without the file
    return out


def descendants(pid: int, limit: int = CHILDREN_MAX) -> list[int]:
    """Children, grandchildren..., breadth first, at most ``limit``, Ray's processes and theirs left out."""
    found: list[int] = []
    frontier = [pid]
    while frontier and len(found) < limit:
        nxt: list[int] = []
        for p in frontier:
            for c in children(p):
                if c not in found and len(found) < limit and not RAY_OWN.search(title(c)):
                    found.append(c)
                    nxt.append(c)
        frontier = nxt
    return found


def stat_fields(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name (which may hold spaces and parentheses), or None when gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()


def cpu_seconds(pid: int) -> tuple[str, float] | None:
    """(state letter, user + system CPU seconds) of a process, or None when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tracer(pid: int) -> int:
    """The pid tracing this process (a debugger, a py-spy reading it), 0 when none or gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def title(pid: int) -> str:
    """What the process calls itself (vLLM retitles its engine "VLLM::EngineCore"), else its command."""
    for name in ("cmdline", "comm"):
        try:
            text = Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if text:
            return text[:120]
    return ""


def is_python(pid: int) -> bool:
    """Whether the process runs a Python interpreter (py-spy reads nothing else)."""
    try:
        return "python" in os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return False


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
LIST_EVERY_S = 5.0  # how often a heartbeat's CPU looks for new children (each thread's list: a Ray worker has dozens)


class TreeCpu:
    """CPU seconds of a process and its live descendants, as deltas between calls. The descendants are
    listed again every ``list_every_s`` (a heartbeat a second read every thread's children file: most of
    what a heartbeat cost); those known are read at every call. A child first seen counts whole if it
    started since the last call, else from now (one that started between two listings, a long-lived child
    that comes back under ``CHILDREN_MAX``). One that exits between two calls takes its last interval with
    it (its time is no longer in /proc): an under-read once, never a negative one."""

    def __init__(self, pid: int | None = None, list_every_s: float = LIST_EVERY_S):
        self.pid = pid if pid is not None else os.getpid()
        self.list_every_s = list_every_s
        self._last: dict[int, float] = {}
        self._since = 0.0  # the last call, in seconds since boot (the clock of a process's start time)
        self._kids: list[int] = []
        self._listed = float("-inf")  # when the descendants were last listed (time.monotonic)
        self.rss = 0  # the resident bytes of the process and its descendants, as the last call read them
        self.delta()

    def delta(self) -> float:
        tick = os.sysconf("SC_CLK_TCK")
        since, self._since = self._since, _uptime()
        if time.monotonic() - self._listed >= self.list_every_s:
            self._kids, self._listed = descendants(self.pid), time.monotonic()
        seen: dict[int, float] = {}
        total = 0.0
        rss = 0
        for p in [self.pid, *self._kids]:
            fields = stat_fields(p)
            if fields is None:
                continue
            used = (int(fields[11]) + int(fields[12])) / tick
            rss += int(fields[21]) * PAGE
            seen[p] = used
            if p in self._last:
                total += used - self._last[p]
            elif since and int(fields[19]) / tick >= since:
                total += used  # born since the last call: all its time is in this interval
        self._last = seen
        self.rss = rss
        return max(total, 0.0)


def _uptime() -> float:
    try:
        return float(_read("/proc/uptime").split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
