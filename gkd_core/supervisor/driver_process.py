"""The driver as a child process: spawned in its own session, watched without ever blocking; or a process
its user started (``AdoptedProcess``); or no process at all, a Ray cluster looked at from outside
(``ClusterWatch``)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from gkd_core.node.ray_cluster import POLL_S, ClusterLook, use_token_if_present
from gkd_core.telemetry import events as ev

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class DriverProcess:
    """One incarnation of the driver. ``poll`` and ``tick`` return at once."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: str | None = None):
        self.argv = argv
        self.log_path: Path | None = log_path  # (None: an adopted driver's, whose output is not ours)
        log = open(log_path, "ab")
        # where this incarnation's output begins: its tail (why it ended) is never an earlier one's
        self._log_start = os.fstat(log.fileno()).st_size
        try:
            # own session and process group: a stop reaches the driver's children too, and a
            # Ctrl-C in the supervisor's terminal does not reach the driver twice
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self.pid = self.proc.pid
        self.started = time.time()
        self._kill_at: float | None = None

    def poll(self) -> int | None:
        return self.proc.poll()

    def terminate(self, grace_s: float) -> None:
        """SIGTERM to the whole group now, SIGKILL after ``grace_s`` (through ``tick``)."""
        if self.poll() is not None or self._kill_at is not None:
            return
        self._signal(signal.SIGTERM)
        self._kill_at = time.monotonic() + grace_s

    def tick(self) -> None:
        if self._kill_at is not None and time.monotonic() >= self._kill_at:
            self._signal(signal.SIGKILL)
            self._kill_at = float("inf")

    def kill_now(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            self.proc.send_signal(sig)

    def exit_said(self, code: int) -> tuple[str, int | None]:
        """(how it ended, in words; its exit code as the run's end says it) once ``poll`` gave ``code``."""
        return describe_exit(code), code

    def log_tail(self, n: int = 20, max_bytes: int = 16384) -> list[str]:
        assert self.log_path is not None  # (an adopted driver says no tail: its own log_tail)
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(self._log_start, size - max_bytes))
                data = f.read()
        except OSError:
            return []
        lines: deque[str] = deque(maxlen=n)
        for line in _ANSI.sub("", data.decode(errors="replace")).splitlines():
            if line.strip():
                # the head of a long line says what it is about ("gkd driver: ...")
                lines.append(line if len(line) <= 600 else line[:600] + " …")
        return list(lines)


class AdoptedProcess(DriverProcess):
    """A driver the supervisor did not start (a job run as its user runs it, that asked for a run of its
    own: gkd_core/integrations/opt_in.py). Its exit code is not ours to read, so its end is "exited"
    (0), and what it said before is in the run's events. Only it is signalled, never its group (its
    shell's), and never a process that took its pid over."""

    def __init__(self, pid: int):
        self.pid = pid
        self.started = time.time()
        self._birth = _start_ticks(pid)
        if self._birth is None:
            raise ProcessLookupError(f"no process {pid} to watch")
        self.argv = _cmdline(pid)
        self.log_path = None
        self._kill_at: float | None = None

    def poll(self) -> int | None:
        return None if _start_ticks(self.pid) == self._birth and _state(self.pid) not in ("Z", "X", None) else 0

    def kill_now(self) -> None:
        pass  # not ours: a supervisor that goes away leaves the job it watched alone

    def _signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except OSError:
                pass

    def exit_said(self, code: int) -> tuple[str, int | None]:
        return f"pid {self.pid} exited (its exit code went to the shell that started it)", None  # (not our child)

    def log_tail(self, n: int = 20, max_bytes: int = 16384) -> list[str]:
        return []  # its output went to its own terminal


class ClusterWatch(DriverProcess):
    """A Ray cluster's jobs looked at from outside (``attach --ray-address``): no process of its own, a look every
    ``poll_s`` in a thread of the supervisor's (``ClusterLook``), each look's events put on ``looks`` for the
    supervisor's loop to record. It ends (0) when the run is stopped."""

    def __init__(self, address: str, looks: queue.SimpleQueue[list[ev.Event]], poll_s: float = POLL_S):
        self.pid = os.getpid()  # (the supervisor's own: nothing else runs for it)
        self.started = time.time()
        self.argv = ["ray state API", address]
        self.address, self.looks, self.poll_s = address, looks, poll_s
        self.log_path = None
        self._kill_at: float | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._look, name="gkd-ray-cluster", daemon=True).start()

    def _look(self) -> None:
        use_token_if_present()
        look = ClusterLook(self.address)
        while True:  # one look at a time, then a pause: never two at once
            self.looks.put(look.look())
            if self._stop.wait(self.poll_s):
                return

    def poll(self) -> int | None:
        return 0 if self._stop.is_set() else None

    def terminate(self, grace_s: float) -> None:
        self._stop.set()

    def tick(self) -> None:
        pass

    def kill_now(self) -> None:
        self._stop.set()

    def exit_said(self, code: int) -> tuple[str, int | None]:
        return f"stopped looking at the Ray cluster at {self.address}", 0

    def log_tail(self, n: int = 20, max_bytes: int = 16384) -> list[str]:
        return []


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None


def _start_ticks(pid: int) -> int | None:
    """When the process began (clock ticks since boot): a pid taken over by another process differs."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def _state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _cmdline(pid: int) -> list[str]:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []
