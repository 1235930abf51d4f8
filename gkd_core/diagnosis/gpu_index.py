"""The GPUs as the danger rule judges them, kept between passes (``rules.gpu.gpu_danger``): a pass reads the GPUs
read since the last, not every GPU (131,072 of them at the largest, 8 to a node).

Kept: the GPUs full of memory at 0 % utilisation (a few, or none), found as their readings come; and each node's
least and most busy GPU, by their minute's averages, which are what the spread between GPUs is judged on, taken
again as the node's readings come (between passes, ``diagnosis.keep_up``). The run's spread is looked at every
``LOOK_S``: a minute's average moves little in that time, and a look walks the nodes' spreads (16,384 at the
largest), not their GPUs.
"""

from __future__ import annotations

from typing import NamedTuple

from gkd_core.state import RunState
from gkd_core.state.records import GpuRow
from gkd_core.telemetry.beats import GPU_FULL_S

GPU_FRESH_S = 2.5 * GPU_FULL_S  # readings older than this are not compared (a node's agent sends each that often)
LOOK_S = 5.0  # how often the spread between the GPUs is looked at


class NodeSpread(NamedTuple):
    """A node's fresh GPUs with an average, as of its newest reading: how many (``gpus``), the least and most busy."""

    gpus: int
    low: GpuRow
    high: GpuRow
    newest: float  # its newest reading's time: a node gone quiet is left out once that is stale


class Spread(NamedTuple):
    """The run's least and most busy GPU by their averages, of ``gpus`` fresh GPUs; ``idle``: those at least
    ``apart`` points below the busiest (sorted)."""

    gpus: int
    low: GpuRow
    high: GpuRow
    idle: list[GpuRow]


class GpuIndex:
    """What ``gpu_danger`` reads, fed by the reducer's GPU feed (``RunRecord.gpu_feed``). ``read``: GPU rows
    read so far (a test counts them)."""

    def __init__(self, state: RunState):
        self.feed = state.gpu_feed()
        self.full_idle: set[str] = set()  # GPUs whose memory is full at 0 % utilisation (GpuRow.full_idle_since)
        self.by_node: dict[str, set[str]] = {}  # node -> its GPUs' keys
        self.nodes: dict[str, NodeSpread] = {}  # node -> its spread, as of its newest reading
        self.look_at = 0.0  # when the spread is looked at next
        self.spread: Spread | None = None  # as of the last look
        self.read = 0
        for node in {self._take(state, key) for key in state.gpus} - {""}:  # (made after GPUs were read: once)
            self._spread_of(state, node)

    def keep_up(self, state: RunState, most: int | None = None) -> None:
        """The GPUs read since the last take (``most`` of them: the rest at the next), and their nodes' spreads."""
        nodes = {node for key in self.feed.take(most) if (node := self._take(state, key))}
        for node in nodes:
            self._spread_of(state, node)

    def _take(self, state: RunState, key: str) -> str:
        """The GPU ``key`` read: whether it is full and idle; its node ("" when it is gone)."""
        g = state.gpus.get(key)
        self.read += 1
        if g is None:
            self.full_idle.discard(key)
            return ""
        if g.full_idle_since is not None:
            self.full_idle.add(key)
        else:
            self.full_idle.discard(key)
        self.by_node.setdefault(g.node, set()).add(key)
        return g.node

    def _spread_of(self, state: RunState, node: str) -> None:
        """``node``'s spread from its GPUs' rows: those with an average, fresh beside its newest reading."""
        keys = self.by_node.get(node, ())
        self.read += len(keys)
        rows = [g for k in keys if (g := state.gpus.get(k)) is not None and g.util_avg is not None]
        newest = max((g.ts for g in rows), default=0.0)
        rows = [g for g in rows if newest - g.ts < GPU_FRESH_S]
        if rows:
            self.nodes[node] = NodeSpread(len(rows), min(rows, key=_avg), max(rows, key=_avg), newest)
        else:
            self.nodes.pop(node, None)

    def spread_at(self, state: RunState, now: float, apart: float) -> Spread | None:
        """The run's spread as of the last look, looked at again every ``LOOK_S`` (a walk of the nodes' spreads,
        not of their GPUs); None with fewer than two fresh GPUs with an average."""
        if now < self.look_at:
            return self.spread
        self.look_at = now + LOOK_S
        fresh = [s for s in self.nodes.values() if now - s.newest < GPU_FRESH_S]
        count = sum(s.gpus for s in fresh)
        if count < 2:
            self.spread = None
            return None
        low = min((s.low for s in fresh), key=_avg)
        high = max((s.high for s in fresh), key=_avg)
        assert low.util_avg is not None and high.util_avg is not None  # (rows with one)
        idle: list[GpuRow] = []
        if high.util_avg - low.util_avg >= apart:  # the GPUs far below the busiest: on the nodes that hold one
            for s in fresh:
                if s.low.util_avg is not None and high.util_avg - s.low.util_avg >= apart:
                    keys = self.by_node.get(s.low.node, ())
                    self.read += len(keys)
                    idle += [g for k in keys if (g := state.gpus.get(k)) is not None and g.util_avg is not None
                             and now - g.ts < GPU_FRESH_S and high.util_avg - g.util_avg >= apart]
        self.spread = Spread(count, low, high, sorted(idle, key=lambda g: (g.node, g.index)))
        return self.spread


def _avg(g: GpuRow) -> float:
    return g.util_avg if g.util_avg is not None else 0.0
