"""integrations/activity's watcher: asleep when there is nothing to show; and a process that may never know
who it is (a Ray task worker, until one of its tasks runs long) asleep between its calls rather than asking
who it is every tick, and asking again while a call runs."""

from __future__ import annotations

import threading
import time

from gkd_core.integrations import activity as act
from gkd_core.integrations.activity import Activity


def asleep_within(a: Activity, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not a.asleep and time.monotonic() < deadline:
        time.sleep(0.02)
    return a.asleep


def test_a_process_that_may_not_know_who_it_is_sleeps_between_calls_and_asks_in_one():
    asked: list[float] = []
    a = Activity(lambda: asked.append(time.monotonic()) or None)  # never anybody
    a.idle_unknown = True
    try:
        a.tracked("produce", time.sleep)(0.3)  # a short task: the watcher starts, asks, and the call ends
        assert asleep_within(a, act.SLEEP_AFTER_S + 1.0)
        before = len(asked)
        time.sleep(act.SLEEP_MAX_S + 0.5)
        assert len(asked) == before  # asleep: nothing asked
        running = threading.Thread(target=a.tracked("produce", time.sleep), args=(1.0,))
        running.start()  # a call wakes it, and it asks again while the call runs
        running.join()
        assert len(asked) - before >= 3, asked
    finally:
        a.close()


def test_otherwise_a_process_that_does_not_know_who_it_is_keeps_asking():
    """An actor whose creator has not written its name yet: asked every few ticks, idle or not."""
    asked: list[float] = []
    a = Activity(lambda: asked.append(time.monotonic()) or None)
    try:
        a.tracked("__init__", time.sleep)(0.05)
        assert not asleep_within(a, act.SLEEP_AFTER_S + 0.5)
        before = len(asked)
        time.sleep(0.6)
        assert len(asked) > before
    finally:
        a.close()
