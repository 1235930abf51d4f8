"""A memory cgroup of a given limit, for a test or a trial that wants the kernel's OOM killer for real: made under
this process's own memory cgroup (v1: ``memory.limit_in_bytes``; v2: ``memory.max``), which needs root; whatever is
in it is killed at the end, and it is removed."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from gkd_core import memory


class NoCgroup(RuntimeError):
    """No memory cgroup can be made here: the message says why."""


@contextlib.contextmanager
def memory_cgroup(limit: int, name: str = "") -> Iterator[Path]:
    """A memory cgroup of ``limit`` bytes (its folder), named ``name`` or after this process; raises ``NoCgroup``."""
    cg = memory.find_cgroup(memory.read_file("/proc/self/cgroup") or "", memory.read_file("/proc/self/mountinfo") or "")
    if cg is None:
        raise NoCgroup("no memory cgroup hierarchy is mounted")
    path = Path(cg.dir) / (name or f"gkd-test-{os.getpid()}")
    # on v2 a child has memory.max only where its parent hands the controller down; the kernel refuses that
    # while the parent holds processes of its own (the root excepted): then writing the limit below fails, and says so
    if cg.version == 2:
        with contextlib.suppress(OSError):
            (Path(cg.dir) / "cgroup.subtree_control").write_text("+memory")
    try:
        path.mkdir()
        (path / ("memory.max" if cg.version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as e:
        with contextlib.suppress(OSError):
            path.rmdir()
        raise NoCgroup(f"{type(e).__name__}: {e}") from e
    try:
        yield path
    finally:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        with contextlib.suppress(OSError):
            path.rmdir()
