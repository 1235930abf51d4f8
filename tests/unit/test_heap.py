"""The supervisor's heap (supervisor/heap.py): what a full collection leaves is frozen, so the next ones walk
only what came after; a cycle that became garbage among frozen objects goes at the thaw."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from gkd_core.supervisor.heap import Heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def thawed_after():
    yield
    gc.unfreeze()
    gc.collect()


def a_cycle() -> Node:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


def test_what_a_full_collection_leaves_is_frozen_and_nothing_is_frozen_before_one():
    gc.unfreeze()
    heap = Heap(thaw_every_s=3600)
    heap.tick(time.monotonic())
    assert gc.get_freeze_count() == 0  # no full collection since it started
    kept = [Node() for _ in range(1000)]
    gc.collect()
    heap.tick(time.monotonic())
    assert gc.get_freeze_count() >= len(kept)
    before = gc.get_freeze_count()
    heap.tick(time.monotonic())
    assert gc.get_freeze_count() == before  # frozen once for each full collection


def test_a_cycle_that_became_garbage_while_frozen_goes_at_the_thaw():
    gc.unfreeze()
    heap = Heap(thaw_every_s=3600)
    alive = a_cycle()
    cycle = weakref.ref(alive)
    gc.freeze()  # as the heap freezes after a full collection, with the cycle in use
    del alive  # then garbage
    gc.collect()
    assert cycle() is not None  # frozen: no collection reaches it
    heap.tick(time.monotonic())
    assert cycle() is not None  # no thaw due
    heap.tick(time.monotonic() + 3600)
    assert cycle() is None
    assert gc.get_freeze_count() > 0  # and what survived the thaw's collection is frozen again
