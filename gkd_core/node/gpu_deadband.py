"""A node's GPU readings, sent when they say something new: its sampler reads every GPU every 2 s, and a GPU's
reading goes to the supervisor, in the node's ``gpus`` batch, only when it moved past a deadband from the last
one sent of that GPU, or ``GPU_FULL_S`` after it, as a node's relay does with its workers' heartbeats. At
131,072 GPUs, 8 to a node, a ``gpu`` event each every 2 s was 65,536 messages a second, four times the workers'
heartbeat batches; a training run's GPUs busy at 95-100 % with their memory held now send a batch a node every
``GPU_FULL_S``.

New is what a rule reads or a person sees move: utilisation by ``UTIL_STEP`` points, or across 0 (a GPU that
stops computing, ``gpu_idle_full``'s); memory, a process's included, by 1/``MEM_STEP`` of the GPU's, or across
``GPU_FULL`` of it (again ``gpu_idle_full``'s); the processes on it, its error; its temperature and power by
``TEMP_STEP`` degrees and ``POWER_STEP`` of the power last sent.
"""

from __future__ import annotations

from gkd_core.state.records import GPU_FULL
from gkd_core.telemetry.beats import GPU_FULL_S
from gkd_core.telemetry.events import GpuEvent, GpuReading

UTIL_STEP = 5.0
MEM_STEP = 64
TEMP_STEP = 3.0
POWER_STEP = 0.1


def same_gpu(was: GpuEvent, g: GpuEvent) -> bool:
    """Whether ``g`` says nothing that ``was``, the last reading sent of the same GPU, did not."""
    if (g.uuid, g.error, g.mem_total) != (was.uuid, was.error, was.mem_total) or set(g.pids) != set(was.pids):
        return False  # (the processes as a set: NVML need not list them in the same order twice)
    if not _within(was.util, g.util, UTIL_STEP) or _idle(was) != _idle(g):
        return False
    step = (g.mem_total or 0) / MEM_STEP
    if not _within(was.mem_used, g.mem_used, step) or _full(was) != _full(g):
        return False
    if g.proc_mem.keys() != was.proc_mem.keys() or any(abs(n - was.proc_mem[p]) >= step for p, n in g.proc_mem.items()):
        return False
    return _within(was.temp, g.temp, TEMP_STEP) and _within(was.power, g.power, POWER_STEP * (was.power or 0.0))


def reading_of(g: GpuEvent) -> GpuReading:
    """A GPU's reading as its node's batch carries it (``gpu_cases.event_of`` the other way)."""
    return GpuReading(g.index, g.uuid, g.util, g.mem_used, g.mem_total, g.temp, g.power, g.pids, g.proc_mem, g.error)


def _within(was: float | None, now: float | None, step: float) -> bool:
    """Both unread, or both read and less than ``step`` apart (a step of 0: only the same reading)."""
    if was is None or now is None:
        return was is now
    return abs(now - was) < step or now == was


def _idle(g: GpuEvent) -> bool:
    return g.util is not None and g.util <= 0.0


def _full(g: GpuEvent) -> bool:
    return bool(g.mem_used and g.mem_total and g.mem_used >= GPU_FULL * g.mem_total)


class GpuDeadband:
    """The last reading sent of each of a node's GPUs, by index, and when (monotonic seconds)."""

    def __init__(self, full_every_s: float = GPU_FULL_S):
        self.full_every_s = full_every_s
        self.said: dict[int, tuple[GpuEvent, float]] = {}

    def new(self, readings: list[GpuEvent], now: float) -> list[GpuEvent]:
        """Of one sample's readings, those to send: new past the deadband, or due in full."""
        out = []
        for g in readings:
            last = self.said.get(g.index)
            if last is None or now - last[1] >= self.full_every_s or not same_gpu(last[0], g):
                self.said[g.index] = (g, now)
                out.append(g)
        return out

    def forget(self) -> None:
        """Send every GPU's next reading: after a note about the node (an NVML error, a call that hung), whose
        banner the readings that follow take down."""
        self.said.clear()
