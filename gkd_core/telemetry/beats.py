"""A heartbeat's parts, as a ``heartbeat`` event and a relay's ``heartbeats`` batch carry them: a worker's
memory beyond its process, one worker's beat inside a batch, and a relay's word for the workers whose beats
it gathers; and a GPU's reading inside a node's ``gpus`` batch (the events themselves: ``events``, which takes
these in)."""

from __future__ import annotations

from typing import Annotated

import msgspec

# Integers on the wire fit in 64 bits, as every producer's do. JSON allows any size, and one past
# what a float holds would overflow the reducer's and the dashboard's float arithmetic
# (OverflowError: the supervisor's loop and the dashboard would die of one event): refused on decode.
INT64 = (-(2**63), 2**63 - 1)
Int = Annotated[int, msgspec.Meta(ge=INT64[0], le=INT64[1])]


class MemoryBeat(msgspec.Struct, array_like=True, gc=False):
    """A heartbeat's memory beyond its process (gkd_core.memory): the scope whose limit the OOM killer acts
    on (the nearest cgroup up the process's tree with a finite limit, or "node"), that scope's use and limit
    in bytes, the node's MemAvailable, and the OOM killer's kills in the scope so far (None: not counted).
    ``[scope, used, limit, available, oom_kills]``."""

    scope: str
    used: Int
    limit: Int
    available: Int = 0
    oom_kills: Int | None = None


class Beat(msgspec.Struct, array_like=True, gc=False):
    """One worker's heartbeat inside a ``heartbeats`` batch, as an array:
    ``[src, ts, phase, elapsed, rss, cpu, dropped, mem]`` (the fields of a ``heartbeat`` event).
    ``beat_of_event`` and ``event_of_beat`` turn one into the other: the one place that knows both shapes.
    Not tracked by the cycle collector (``gc=False``; it holds no container, so it can be in no cycle): 65,536
    a second at the largest would set off its collections (supervisor/heap)."""

    src: str
    ts: float
    phase: str = ""
    elapsed: float = 0.0
    rss: Int = 0
    cpu: float = 0.0
    dropped: Int = 0
    mem: MemoryBeat | None = None


# A relay sends each worker's beat in full at least this often, however little it says (``relay.same_beat``):
# the shown CPU and RSS are never older (a larger change goes at once), and a relay's clock vouches for a
# worker no further than a while past its newest full beat (``state.views.heartbeat_at``). The log's period
# (``heartbeat_log_s``, 10 s by default): the log keeps one beat of a still worker that often, and a full beat
# more often than it keeps is work for nothing (at 65,536 still workers, 6,554 beats a second)
FULL_BEAT_S = 10.0
# A node's agent sends each GPU's reading in full at least this often, however little it moved (``gpu_deadband``):
# a GPU's row is as fresh as that (the GPU rule compares the readings of 2.5 periods, ``gpu_index.GPU_FRESH_S``),
# and a GPU that holds still sends a third of what it would every FULL_BEAT_S, 4,369 readings a second at 131,072
GPU_FULL_S = 30.0


class RelayClock(msgspec.Struct, array_like=True, gc=False):
    """A relay's word for the workers whose beats it gathers, once a batch, in place of a line per worker:
    each worker of its roster was heard from at ``ts`` or later (the oldest of their newest beats). Its
    roster is who it vouches for: a worker joins it with its first beat, sent in full (``joined``: since
    the relay's last batch), and leaves it when no beat has come from it for ``relay.QUIET_BEATS``
    periods (``quiet``: ``[src, ts]``, the time of its newest beat). ``epoch``: when the relay started; a
    relay started again vouches for none of the workers of the one before until they join it.
    ``[relay, epoch, ts, joined, quiet]``."""

    relay: str
    epoch: float
    ts: float
    joined: tuple[str, ...] = ()  # (tuples: a batch's usual empty ones are no objects of their own)
    quiet: tuple[tuple[str, float], ...] = ()


class GpuReading(msgspec.Struct, array_like=True, gc=False):
    """One GPU's reading inside a node's ``gpus`` batch, as an array: ``[index, uuid, util, mem_used, mem_total,
    temp, power, pids, proc_mem, error]`` (a ``gpu`` event's fields, less its node and time, which are the
    batch's): a third of the bytes of the event's own shape, 131,072 GPUs' readings in a node's batch each full
    beat. Not tracked by the cycle collector (``gc=False``: its lists hold numbers, so it can be in no cycle)."""

    index: Int
    uuid: str = ""
    util: float | None = None
    mem_used: Int | None = None
    mem_total: Int | None = None
    temp: float | None = None
    power: float | None = None
    pids: list[Int] = []
    proc_mem: dict[str, Int] = {}
    error: str = ""
