"""The few workers some rules name, by what marks them, kept from the state's feed: an actor Ray says is dead or
cannot place, a death Ray says was out of memory, a kill by the OOM killer, events dropped; and the workers of
each node. A pass reads the marked workers, not 131,072 to find them. A worker's marks change only with what the
reducer feeds (``state.feed``: Ray's word, an OOM kill, a count of dropped events, its registration), not with
its phase, which the rules read when they name it.
"""

from __future__ import annotations

from collections.abc import Callable

from gkd_core.state import OOM, RunState, WorkerState

MARKS: dict[str, Callable[[WorkerState], bool]] = {
    "dead_actor": lambda w: w.ray_state == "DEAD",
    "pending_creation": lambda w: w.ray_state == "PENDING_CREATION",
    "oom_death": lambda w: bool(w.ray_death_cause) and OOM.search(w.ray_death_cause) is not None,
    "oom_killed": lambda w: w.oom_killed is not None,
    "dropping": lambda w: w.dropped != 0,
}


class Marks:
    """Each mark's workers, in the state's order, kept between passes (``state.kept``)."""

    def __init__(self, state: RunState) -> None:
        self._feed = state.feed(moves=False)
        self._marked: dict[str, dict[str, int]] = {name: {} for name in MARKS}  # mark -> worker -> its place
        self._place: dict[str, int] = {}
        self._on_node: dict[str, dict[str, int]] = {}  # node -> its workers -> their places
        self._node_of: dict[str, str] = {}
        self._read_all = True
        self.read = 0  # workers read since made (a test counts what a pass costs)

    def of(self, state: RunState, mark: str) -> list[WorkerState]:
        """The workers that bear ``mark`` now, in the state's order."""
        self._update(state)
        return self._in_order(state, self._marked[mark])

    def on_node(self, state: RunState, node: str) -> list[WorkerState]:
        """The workers on ``node``, in the state's order."""
        self._update(state)
        return self._in_order(state, self._on_node.get(node, {}))

    def keep_up(self, state: RunState, most: int) -> None:
        """Take in ``most`` of the workers fed since the last pass now, between passes (``diagnosis.keep_up``)."""
        if not self._read_all:  # (else at the next pass)
            self._update(state, most)

    def _update(self, state: RunState, most: int | None = None) -> None:
        changed = None if self._read_all else self._feed.take(most)
        if changed is None:  # everything: at the first pass, or after the feed overflowed
            self._feed.take()
            self._read_all = False
            self._marked, self._on_node, self._node_of = {name: {} for name in MARKS}, {}, {}
            self._place = {src: i for i, src in enumerate(state.workers)}
            changed = state.workers
        for src, w in changed.items():
            self.read += 1
            place = self._place.setdefault(src, len(self._place))
            for name, marked in MARKS.items():
                if marked(w):
                    self._marked[name][src] = place
                else:
                    self._marked[name].pop(src, None)
            was = self._node_of.get(src)
            if was != w.node:
                if was is not None:
                    del self._on_node[was][src]
                self._node_of[src] = w.node
                self._on_node.setdefault(w.node, {})[src] = place

    @staticmethod
    def _in_order(state: RunState, got: dict[str, int]) -> list[WorkerState]:
        return [state.workers[src] for src in sorted(got, key=got.__getitem__)]


def marked(state: RunState, mark: str) -> list[WorkerState]:
    """The workers of ``state`` that bear ``mark`` (one of ``MARKS``), in its order."""
    return marks_of(state).of(state, mark)


def on_node(state: RunState, node: str) -> list[WorkerState]:
    """The workers of ``state`` on ``node``, in its order."""
    return marks_of(state).on_node(state, node)


def marks_of(state: RunState) -> Marks:
    return state.kept("marks", lambda: Marks(state))
