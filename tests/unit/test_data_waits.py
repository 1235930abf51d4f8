"""integrations/data_waits, in this process on a real Activity: a job's call that waits on a queue or a gate
is a wait of that call on the methods whose calls set it, with the kind, the job's line and the numbers it
holds; a wait outside any call of the job, or one that returns at once, is none; and the patches go back as
they were after each test."""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import pytest

from gkd_core.integrations import calls, data_waits
from gkd_core.integrations.activity import Activity
from gkd_core.vocab import DataWait

PATCHED = [(asyncio.Event, "wait"), (asyncio.Event, "set"), (asyncio.Condition, "wait"),
           (asyncio.Condition, "notify"), (asyncio.Queue, "get"), (asyncio.Queue, "put_nowait"),
           (threading.Condition, "wait"), (threading.Condition, "notify")]


@pytest.fixture
def activity(monkeypatch) -> Activity:
    for owner, name in [*PATCHED, (threading, "excepthook")]:  # put back after the test, whatever it does
        monkeypatch.setattr(owner, name, getattr(owner, name))
    said = []
    a = Activity(lambda: None)
    data_waits.install(a, lambda what, e: said.append((what, e)))
    yield a
    assert said == []
    a.close()


def waits(a: Activity) -> list:
    return [c for c in list(a._active.values()) if c.wait]


def test_an_async_call_parked_on_a_condition_waits_on_the_method_that_notified_it(activity):
    class Rollouter:
        def __init__(self):
            self.produced, self.param_version, self.gate = 12, 4, asyncio.Condition()

        async def update_param_version(self):
            calls.entered_async(asyncio.current_task(), "update_param_version")
            async with self.gate:
                self.gate.notify_all()

        async def run(self):
            calls.entered_async(asyncio.current_task(), "run")
            async with self.gate:
                await self.gate.wait()

    async def main():
        r = Rollouter()
        await r.update_param_version()  # a set before the wait: who sets it is known when it waits
        parked = asyncio.ensure_future(r.run())
        await asyncio.sleep(0.05)
        (wait,) = waits(activity)
        assert wait.waits_on() == [DataWait(("update_param_version",)).said()]
        said = wait.progress()
        assert said.startswith("waiting on an asyncio.Condition in run (test_data_waits.py:"), said
        assert "its numbers: produced=12, param_version=4" in said and "set by update_param_version" in said
        await r.update_param_version()
        await parked
        assert waits(activity) == []  # it ended with the wait

    asyncio.run(main())


def test_an_async_queue_waited_on_empty_is_a_wait_and_one_with_items_is_none(activity):
    async def main():
        q: asyncio.Queue = asyncio.Queue()

        async def get():
            calls.entered_async(asyncio.current_task(), "get_sample")
            return await q.get()

        q.put_nowait(1)  # (outside any call: no setter noted)
        assert await get() == 1 and waits(activity) == []  # not empty: returned at once, nothing noted
        getting = asyncio.ensure_future(get())
        await asyncio.sleep(0.02)
        (wait,) = waits(activity)
        assert wait.waits_on() == ["data"] and "set by nothing yet" in wait.progress()
        q.put_nowait(2)
        assert await getting == 2

    asyncio.run(main())


def test_a_tracked_method_parked_on_a_threading_event_or_a_queue_waits_on_the_method_that_set_it(activity):
    gate, samples = threading.Event(), queue.Queue()
    seen = {}

    def run():
        gate.wait(5)
        return samples.get(timeout=5)

    def opened():
        gate.set()

    def put():
        samples.put("sample")

    running = threading.Thread(target=activity.tracked("run", run))
    running.start()
    deadline = time.monotonic() + 5
    while not waits(activity) and time.monotonic() < deadline:
        time.sleep(0.01)
    (wait,) = waits(activity)
    seen["gate"] = (wait.waits_on(), wait.progress())
    activity.tracked("update_param_version", opened)()  # a tracked call of this thread's sets it
    while (not waits(activity) or waits(activity)[0] is wait) and time.monotonic() < deadline:
        time.sleep(0.01)
    (wait,) = waits(activity)
    seen["queue"] = (wait.waits_on(), wait.progress())
    activity.tracked("put_sample", put)()
    running.join(5)
    assert seen["gate"][0] == ["data"] and "a threading.Event in run (test_data_waits.py:" in seen["gate"][1]
    assert seen["queue"][0] == ["data"] and "a queue.Queue in run" in seen["queue"][1]
    # set inside a call, each is known by that call's method from then on
    assert list(getattr(gate._cond, data_waits.SET_BY)) == ["update_param_version"]
    assert list(getattr(samples.not_empty, data_waits.SET_BY)) == ["put_sample"]


def test_a_wait_outside_any_call_of_the_job_is_none_and_a_thread_that_sets_is_noted_by_its_name(activity):
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    assert done.wait(5)  # the main thread, not in a call: its waits are its own business
    assert waits(activity) == []
    assert [DataWait.thread(m) for m in getattr(done._cond, data_waits.SET_BY)] == [threading.Timer.__name__ + "-1"] \
        or list(getattr(done._cond, data_waits.SET_BY))[0].startswith("~Thread-")


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # (pytest's hook: the one before)
def test_a_call_polling_a_queue_that_only_a_dead_thread_fed_says_the_thread_and_its_error(activity):
    """slime's shape: a producer thread of the actor's own fills a queue.Queue, and a call polls it with a
    timeout; the thread raises. The call's wait then names the thread, ended, and the error it died of."""
    samples: queue.Queue = queue.Queue()

    def produce():
        samples.put({"n": 0})
        raise ValueError("sample 1 has no reward\nsecond line")

    producer = threading.Thread(target=produce, name="rollout-producer")
    producer.start()
    producer.join(5)
    def get_batch():
        samples.get(timeout=5)
        for _ in range(10):  # then it polls an empty queue
            try:
                samples.get(timeout=0.2)
            except queue.Empty:
                continue

    polling = threading.Thread(target=activity.tracked("get_batch", get_batch))
    polling.start()
    seen = []
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        seen = [(w.waits_on(), w.progress()) for w in waits(activity) if "~" in w.waits_on()[0]]
        time.sleep(0.02)
    polling.join(5)
    assert seen, "no wait on the dead thread's queue was noted"
    on, said = seen[-1]
    assert on == [DataWait(("~rollout-producer!",)).said()] and DataWait.ended(on[0][5:]), on
    assert said.endswith("set only by its thread rollout-producer, which ended with ValueError: sample 1 has no "
                         "reward"), said
    assert threading.excepthook.__wrapped__ is not None  # the process's own hook is called after ours
