"""The supervisor's heap and Python's cycle collector.

At 65,536 workers the run's state is some 600,000 objects the collector tracks (each worker's record and
its lists), nearly all of them as old as the run. The heartbeats' churn (objects that live for a drain or a
second) sets off a full collection every few seconds, and each walks every one of them: a quarter of a
second here in which nothing is read, published or drawn, and a twentieth of the supervisor's CPU.

So what survives a full collection is frozen (``gc.freeze``): the next ones walk only what came after. A
cycle among frozen objects that becomes garbage later waits for the thaw: every ``THAW_EVERY_S`` the heap
is thawed and collected whole once (the state's records hold no cycles; a thaw is the guard, not the
rule). The same pause, once in that time instead of every few seconds.
"""

from __future__ import annotations

import gc
import time

THAW_EVERY_S = 600.0


class Heap:
    def __init__(self, thaw_every_s: float = THAW_EVERY_S):
        self.thaw_every_s = thaw_every_s
        self._full_seen = _full_collections()
        self._thawed_at = time.monotonic()

    def tick(self, now: float) -> None:
        """Call at the loop's chores: freezes what the latest full collection left, thaws when one is due."""
        if now - self._thawed_at >= self.thaw_every_s:
            self._thawed_at = now
            gc.unfreeze()
            gc.collect()
        full = _full_collections()
        if full != self._full_seen:
            self._full_seen = full
            gc.freeze()


def _full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])
