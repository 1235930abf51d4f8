"""The reducer's word of which workers (and memory scopes) changed, for the diagnosis's indexes: a pass reads what
changed since the last, not every worker (131,072 of them at the largest).

A worker is fed when it is new, or when something an index keeps of it changes: its phase, spans or role
(``RunRecord.mark_moved``), Ray's word of it, its registration (node, pid), its memory scope, its count of dropped
events, an OOM kill. Not a heartbeat's numbers: they change for every worker every second (a rule that reads them
reads them when it judges the worker). A memory scope is fed when it is made or let go, and with each new reading
its index wants (``ScopeFeed``).
"""

from __future__ import annotations

import collections
import collections.abc
import itertools
from collections.abc import Callable

from gkd_core.state.records import ScopeMemory, WorkerState

# entries one feed holds before it gives up on them and tells its index to read everything again: an index that
# stopped taking (a state no longer diagnosed) costs this much at the most, and an index behind by more than a
# step of 131,072 workers' phases would read about as much either way
FEED_MAX = 1 << 20


class Feed:
    """The workers fed since the last ``take``, in the order each was first fed, each once: one already waiting is
    not fed again (an index reads a worker as it is when it takes it in, so a worker changed four times as it joins,
    131,072 of them at once, is read once)."""

    __slots__ = ("changed", "moves", "overflowed", "_waiting", "__weakref__")

    def __init__(self, moves: bool = True) -> None:
        self.changed: collections.deque[WorkerState] = collections.deque()
        self.moves = moves  # fed a worker's change of phase, spans or role too
        self.overflowed = False
        self._waiting: set[str] = set()  # the sources in ``changed``

    def __len__(self) -> int:
        return len(self.changed)

    def add(self, w: WorkerState) -> None:
        if w.src in self._waiting:
            return
        if len(self.changed) < FEED_MAX:
            self.changed.append(w)
            self._waiting.add(w.src)
        else:
            self.changed, self._waiting, self.overflowed = collections.deque(), set(), True

    def take(self, most: int | None = None) -> dict[str, WorkerState] | None:
        """The workers fed since the last take (the first ``most`` of them: the rest at the next), each once, in the
        order each was first fed (a new worker's first word is its making: new workers come in the state's order);
        None when the feed overflowed: every worker may have changed."""
        if self.overflowed:
            self.changed, self._waiting, self.overflowed = collections.deque(), set(), False
            return None
        if most is None or most >= len(self.changed):
            changed: collections.abc.Iterable[WorkerState] = self.changed
            self.changed, self._waiting = collections.deque(), set()
        else:
            changed = [self.changed.popleft() for _ in range(most)]
            self._waiting.difference_update(w.src for w in changed)
        return {w.src: w for w in changed}


class ScopeFeed(set[str]):
    """The memory scopes (``RunRecord.mem_scopes``' keys) made, let go, or with a new reading that ``wants`` (None:
    every one) since the last ``take``: each once. ``made_only``: no reading, only the making and the letting go (an
    index that looks at its scopes' readings when it is due to, ``diagnosis.memory_growth``). A node's reading comes
    with every heartbeat batch of its relay, 16,384 a second at the largest: an index that wants few of them is fed
    those, and asked per reading (``RunRecord.touch_scope``). A feed of the GPUs read (``RunRecord.gpu_feed``) is one
    too, of ``gpus``' keys."""

    def __init__(self, wants: Callable[[ScopeMemory], bool] | None = None, made_only: bool = False):
        super().__init__()
        self.wants, self.made_only = wants, made_only

    def take(self, most: int | None = None) -> set[str]:
        """The scopes fed since the last take (any ``most`` of them: the rest at the next)."""
        if most is None or most >= len(self):
            taken = set(self)
            self.clear()
        else:
            taken = set(itertools.islice(self, most))
            self -= taken
        return taken
