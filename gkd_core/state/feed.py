"""The reducer's word of which workers (and memory scopes) changed, for the diagnosis's indexes: a pass reads what
changed since the last, not every worker (131,072 of them at the largest).

A worker is fed when it is new, or when something an index keeps of it changes: its phase, spans or role
(``RunRecord.mark_moved``), Ray's word of it, its registration (node, pid), its memory scope, its count of dropped
events, an OOM kill. Not a heartbeat's numbers: they change for every worker every second (a rule that reads them
reads them when it judges the worker). A memory scope is fed with each new reading (``ScopeFeed``).
"""

from __future__ import annotations

from gkd_core.state.records import WorkerState

# entries one feed holds before it gives up on them and tells its index to read everything again: an index that
# stopped taking (a state no longer diagnosed) costs this much at the most, and an index behind by more than a
# step of 131,072 workers' phases would read about as much either way
FEED_MAX = 1 << 20


class Feed:
    """The workers fed since the last ``take``, oldest first (a worker changed twice is there twice)."""

    __slots__ = ("changed", "moves", "overflowed", "__weakref__")

    def __init__(self, moves: bool = True) -> None:
        self.changed: list[WorkerState] = []
        self.moves = moves  # fed a worker's change of phase, spans or role too
        self.overflowed = False

    def add(self, w: WorkerState) -> None:
        if len(self.changed) < FEED_MAX:
            self.changed.append(w)
        else:
            self.changed, self.overflowed = [], True

    def take(self, most: int | None = None) -> dict[str, WorkerState] | None:
        """The workers fed since the last take (the first ``most`` of them: the rest at the next), each once, in the
        order each was first fed (a new worker's first word is its making: new workers come in the state's order);
        None when the feed overflowed: every worker may have changed."""
        if self.overflowed:
            self.changed, self.overflowed = [], False
            return None
        if most is None or most >= len(self.changed):
            changed, self.changed = self.changed, []
        else:
            changed, self.changed = self.changed[:most], self.changed[most:]
        out: dict[str, WorkerState] = {}
        for w in changed:
            if w.src not in out:
                out[w.src] = w
        return out


class ScopeFeed(set[str]):
    """The memory scopes (``RunRecord.mem_scopes``' keys) with a new reading since the last ``take``: each once (a
    node's is said with every heartbeat batch of its relay; there are at most ``SCOPES_KEEP`` of them)."""

    def take(self) -> set[str]:
        taken = set(self)
        self.clear()
        return taken
