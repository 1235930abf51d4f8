"""What the plots draw: a run's numbers over time, each series bounded.

A step's metrics (loss, KL, agreement, the time of each phase) are kept already
(``RunState.metrics``); these are the rest: each sync's duration against its timeout, the teacher's
latency and queue, and the GPUs' use. A point is taken at most once per ``*_POINT_S`` of event time
(or when the clock went back by over ``CLOCK_BACK_S``: one event from the future must not stop a series,
while senders whose clocks differ by seconds must not take a point each), so a chatty sender does not
crowd the history out, and each series keeps its newest
``SERIES_KEEP`` points. Every update is O(1) in the size of the run but the teacher's (O(its
clients), once a second): the supervisor applies every event of 65,536 workers through here.
"""

from __future__ import annotations

from typing import TypeVar

import msgspec

SERIES_KEEP = 512
TEACHER_POINT_S = 1.0
GPU_POINT_S = 2.0
CLOCK_BACK_S = 60.0  # a newest point this far ahead of an event: a clock that jumped, not nodes' skew
# devices with a line of their own (the first seen): past a node or two, a line per device is a
# smear; every GPU counts in the mean
GPU_DEVICES_DRAWN = 16
QUEUES_DRAWN = 8  # the job's queues with a line of their own (the first seen)
P = TypeVar("P")  # a series' point


class SyncPoint(msgspec.Struct, array_like=True):
    """A finished (or superseded) sync: how long it took against its timeout."""

    sync_id: int
    step: int | None
    elapsed_s: float
    timeout_s: float
    state: str
    parts: dict[str, float] = {}  # part -> the longest any member took in it (SyncState.parts_took)


class TeacherPoint(msgspec.Struct, array_like=True):
    ts: float
    p50_ms: float | None  # the slowest client's: what the run feels
    p99_ms: float | None
    queue: int  # waiting at the servers
    in_flight: int  # sent by the clients, not answered yet


class GpuPoint(msgspec.Struct, array_like=True):
    ts: float
    util: float | None  # percent
    mem: float | None  # used over total, 0-1


class GpuSums(msgspec.Struct, kw_only=True):
    """Sums over every GPU's newest reading, kept as readings replace each other: the mean in O(1)."""

    util: float = 0.0
    util_n: int = 0
    idle_n: int = 0  # of them, at 0 %
    mem: float = 0.0
    mem_n: int = 0

    def take(self, util: float | None, mem: float | None, sign: int) -> None:
        if util is not None:
            self.util += sign * util
            self.util_n += sign
            self.idle_n += sign if util <= 0.0 else 0
        if mem is not None:
            self.mem += sign * mem
            self.mem_n += sign

    def mean(self, ts: float) -> GpuPoint:
        return GpuPoint(ts, self.util / self.util_n if self.util_n else None,
                        self.mem / self.mem_n if self.mem_n else None)


class DepthPoint(msgspec.Struct, array_like=True):
    ts: float
    depth: int
    behind: float | None = None  # the samples taken since the point before: versions behind, on average


class Series(msgspec.Struct, kw_only=True):
    syncs: list[SyncPoint] = []
    teacher: list[TeacherPoint] = []
    gpus: dict[str, list[GpuPoint]] = {}  # "node/index" -> its readings, for GPU_DEVICES_DRAWN devices
    gpu_mean: list[GpuPoint] = []  # over every GPU
    gpu_sums: GpuSums = msgspec.field(default_factory=GpuSums)
    queues: dict[str, list[DepthPoint]] = {}  # "worker queue" -> its depth, for QUEUES_DRAWN queues

    def note_sync(self, sync_id: int, step: int | None, elapsed_s: float, timeout_s: float, state: str,
                  parts: dict[str, float] | None = None) -> None:
        point = SyncPoint(sync_id, step, elapsed_s, timeout_s, state, dict(parts or {}))
        # the same sync again (its members' late words, its end after its successor began): its point, anew
        for i in range(len(self.syncs) - 1, max(-1, len(self.syncs) - 5), -1):
            if self.syncs[i].sync_id == sync_id:
                self.syncs[i] = point
                return
        _append(self.syncs, point)

    def teacher_due(self, ts: float) -> bool:
        return not self.teacher or _due(ts, self.teacher[-1].ts, TEACHER_POINT_S)

    def note_teacher(self, point: TeacherPoint) -> None:
        _append(self.teacher, point)

    def note_queue(self, key: str, ts: float, depth: int, behind: float | None = None) -> None:
        """A queue's depth and its taken samples' staleness (its worker's ``flow`` event, every few seconds while
        it changes)."""
        points = self.queues.get(key)
        if points is None:
            if len(self.queues) >= QUEUES_DRAWN:
                return
            points = self.queues[key] = []
        _append(points, DepthPoint(ts, depth, behind))

    def note_gpu(self, key: str, ts: float, old: tuple[float | None, float | None] | None,
                 util: float | None, mem: float | None) -> None:
        """A GPU's new reading, ``old`` its last one (util, mem) if it had one; each is clamped to its
        range, so a sender's absurd number cannot make the sums infinite (a keyframe's JSON has no inf)."""
        util, mem = _within(util, 100.0), _within(mem, 1.0)
        if old is not None:
            old = (_within(old[0], 100.0), _within(old[1], 1.0))
            self.gpu_sums.take(*old, sign=-1)
        self.gpu_sums.take(util, mem, sign=1)
        if not self.gpu_mean or _due(ts, self.gpu_mean[-1].ts, GPU_POINT_S):
            _append(self.gpu_mean, self.gpu_sums.mean(ts))
        else:  # the newest point follows the readings of its interval (a node's GPUs come one by one)
            self.gpu_mean[-1] = self.gpu_sums.mean(self.gpu_mean[-1].ts)
        points = self.gpus.get(key)
        if points is None:
            if len(self.gpus) >= GPU_DEVICES_DRAWN:
                return
            points = self.gpus[key] = []
        if not points or _due(ts, points[-1].ts, GPU_POINT_S):
            _append(points, GpuPoint(ts, util, mem))


def mem_share(used: int | None, total: int | None) -> float | None:
    return used / total if used is not None and total else None


def _due(ts: float, last: float, every_s: float) -> bool:
    return ts - last >= every_s or last - ts > CLOCK_BACK_S


def _within(x: float | None, top: float) -> float | None:
    return None if x is None or x != x else min(max(x, 0.0), top)


def _append(points: list[P], point: P) -> None:
    points.append(point)
    if len(points) > SERIES_KEEP:
        del points[0]
