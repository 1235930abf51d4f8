"""GPU readings with a deadline: a child process does the NVML calls, this thread never blocks.

A call on a wedged driver does not return, and the process that made it sits in uninterruptible
sleep: it cannot be killed, and a fresh probe would only join it. So the sampler keeps one child
and one request in flight. A request unanswered past its deadline is reported on ``gpu`` events
as ``nvml_hung_s``, growing, until it is answered; the child is never respawned while it lives,
and one that died is respawned with a growing back-off. ``nvidia-smi`` is probed the same way (the
seeds' users saw it freeze too): one at a time, under a hard timeout, never waited for. A sample's readings go
as one ``gpus`` event of the node, those that say something new (``gpu_deadband``).
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import msgspec

from gkd_core.node.gpu_deadband import GpuDeadband, reading_of
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.beats import GPU_FULL_S

TICK_S = 0.25
BACKOFF_S = (5.0, 300.0)  # first respawn after a child died, and the most it grows to
SMI_QUERY = ["--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader"]


class GpuSampler:
    def __init__(self, node: str, emit: Callable[[ev.Event], None], backend: str = "nvml",
                 interval_s: float = 2.0, deadline_s: float = 3.0, smi_every_s: float = 30.0,
                 smi_timeout_s: float = 5.0, smi: str | None = "nvidia-smi", full_every_s: float = GPU_FULL_S):
        self.node, self.emit, self.backend = node, emit, backend
        self.interval_s, self.deadline_s = interval_s, deadline_s
        self.smi_every_s, self.smi_timeout_s = smi_every_s, smi_timeout_s
        self.smi_path = shutil.which(smi) if smi else None
        self.child: subprocess.Popen | None = None
        self.no_driver = ""
        self.samples = 0
        self.deadband = GpuDeadband(full_every_s)  # (0: every reading is sent)
        self._buf = b""
        self._requested_at: float | None = None
        self._next_sample = 0.0
        self._next_hung_report = 0.0
        self._last_beat = 0.0
        self._respawn_at = 0.0
        self._backoff = BACKOFF_S[0]
        self._smi: subprocess.Popen | None = None
        self._smi_started = 0.0
        self._smi_reported = False
        self._next_smi = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gpu-sampler-{node}", daemon=True)

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> GpuSampler:
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        for proc in (self.child, self._smi):
            if proc is not None and proc.poll() is None:
                proc.kill()  # never waited for: one in uninterruptible sleep would hold us

    @property
    def hung_s(self) -> float | None:
        """How long the request in flight has gone unanswered, once past the deadline."""
        if self._requested_at is None:
            return None
        waited = time.monotonic() - self._requested_at
        return waited if waited > self.deadline_s else None

    # --- the loop ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            if self.child is None and not self.no_driver and now >= self._respawn_at:
                self._spawn()
            if self.child is not None and self._requested_at is None and now >= self._next_sample:
                self._request(now)
            self._read(TICK_S)
            now = time.monotonic()
            self._report_hang(now)
            if self.smi_path and not self.no_driver:
                self._probe_smi(now)

    def _spawn(self) -> None:
        self._buf = b""
        try:
            self.child = subprocess.Popen([sys.executable, "-m", "gkd_core.node.gpu_child", self.backend,
                                           str(os.getpid())],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          start_new_session=True)
        except OSError as e:  # no process to be had (limits, memory): say so, try again later
            self.emit(ev.GpuEvent(node=self.node, index=-1, error=f"the GPU sampler could not start: {e}"))
            self._respawn_at = time.monotonic() + self._backoff
            self._backoff = min(BACKOFF_S[1], self._backoff * 2)
            return
        assert self.child.stdout is not None  # (a pipe)
        os.set_blocking(self.child.stdout.fileno(), False)
        self._last_beat = time.monotonic()

    def _request(self, now: float) -> None:
        assert self.child is not None and self.child.stdin is not None  # (asked of a child, through its pipe)
        try:
            self.child.stdin.write(b"sample\n")
            self.child.stdin.flush()
        except OSError:
            return  # the child is gone; _read sees its end
        self._requested_at = now
        self._next_sample = now + self.interval_s

    def _read(self, timeout_s: float) -> None:
        if self.child is None:
            self._stop.wait(timeout_s)
            return
        out = self.child.stdout
        assert out is not None  # (a pipe)
        ready, _, _ = select.select([out], [], [], timeout_s)
        if not ready:
            return
        chunk = out.read()
        if chunk:
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                if line.strip():
                    self._on_message(line)
            return
        self._child_ended()

    def _on_message(self, line: bytes) -> None:
        try:
            msg = msgspec.json.decode(line)
        except msgspec.DecodeError:
            return
        kind = msg.get("kind")
        self._last_beat = time.monotonic()
        if kind == "sample":
            self._answered()
            self.samples += 1
            readings = [msgspec.convert(g, ev.GpuEvent) for g in msg.get("gpus") or []]
            new = self.deadband.new(readings, time.monotonic())
            if new:  # (the node's, one message: the readings that say something new, or are due in full)
                self.emit(ev.GpusEvent(node=self.node, readings=[reading_of(g) for g in new]))
        elif kind == "error":
            self._answered()
            self.deadband.forget()
            self.emit(ev.GpuEvent(node=self.node, index=-1, error=f"NVML error: {msg.get('error')}"))
        elif kind == "no_driver":
            self.no_driver = str(msg.get("error") or "no NVIDIA driver on this node")
            self.emit(ev.GpuEvent(node=self.node, index=-1, error=self.no_driver))

    def _answered(self) -> None:
        if self._requested_at is not None and self.hung_s is not None:
            self.deadband.forget()
            # the reducer clears the banner on the readings that follow; say how long it was
            self.emit(ev.LogEvent(level="warn", message=f"NVML on {self.node} answered again after "
                                                        f"{time.monotonic() - self._requested_at:.1f} s"))
        self._requested_at = None

    def _child_ended(self) -> None:
        assert self.child is not None  # (it was reading it)
        code: int | str
        try:  # it closed its stdout: it has exited, or is about to (unless stuck in the driver)
            code = self.child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.child.kill()  # not waited for again: the OS reaps it when it can
            code = "unknown (it would not exit)"
        self.child = None
        self._requested_at = None
        if self.no_driver:
            return
        self.emit(ev.GpuEvent(node=self.node, index=-1,
                              error=f"the GPU sampler exited with code {code}; next try in {self._backoff:.0f} s"))
        self._respawn_at = time.monotonic() + self._backoff
        self._backoff = min(BACKOFF_S[1], self._backoff * 2)
        self.deadband.forget()

    def _report_hang(self, now: float) -> None:
        hung = self.hung_s
        if hung is None or now < self._next_hung_report:
            return
        self._next_hung_report = now + min(1.0, self.interval_s)
        alive = now - self._last_beat < 3.0
        why = ("the sampler process is alive, its NVML call has not returned" if alive
               else "the sampler process has stopped answering altogether")
        self.emit(ev.GpuEvent(node=self.node, index=-1, nvml_hung_s=round(hung, 1), error=why))

    def _probe_smi(self, now: float) -> None:
        assert self.smi_path is not None  # (probed only where nvidia-smi was found)
        if self._smi is None:
            if now >= self._next_smi:
                self._smi = subprocess.Popen([self.smi_path, *SMI_QUERY], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
                self._smi_started, self._next_smi = now, now + self.smi_every_s
            return
        if self._smi.poll() is not None:  # done (and reaped)
            self._smi = None
            if self._smi_reported:
                self._smi_reported = False
                self.emit(ev.GpuEvent(node=self.node, index=-1, probe="nvidia-smi"))
            return
        waited = now - self._smi_started
        if waited > self.smi_timeout_s:
            if not self._smi_reported:
                try:
                    os.killpg(self._smi.pid, signal.SIGKILL)  # in uninterruptible sleep it stays anyway
                except OSError:
                    pass
            self._smi_reported = True
            self.emit(ev.GpuEvent(node=self.node, index=-1, probe="nvidia-smi", nvml_hung_s=round(waited, 1),
                                  error=f"nvidia-smi has not exited after {waited:.0f} s"))
