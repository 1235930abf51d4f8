"""integrations/data_waits, in this process on a real Activity: a job's call that waits on a queue or a gate
is a wait of that call on the methods whose calls set it, with the kind, the job's line and the numbers it
holds; a wait outside any call of the job, or one that returns at once, is none; and the patches go back as
they were after each test."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import gc
import queue
import threading
import time
import types

import pytest

from gkd_core.integrations import calls, data_waits
from gkd_core.integrations.activity import TICK_S, Activity
from gkd_core.integrations.job_queues import Queues
from gkd_core.telemetry.events import QueueDepth
from gkd_core.vocab import DataWait

PATCHED = [(asyncio.Event, "wait"), (asyncio.Event, "set"), (asyncio.Condition, "wait"),
           (asyncio.Condition, "notify"), (asyncio.Queue, "get"), (asyncio.Queue, "put_nowait"),
           (threading.Condition, "wait"), (threading.Condition, "notify")]


@pytest.fixture
def queues() -> Queues:
    return Queues()


@pytest.fixture
def activity(monkeypatch, queues) -> Activity:
    for owner, name in [*PATCHED, (threading, "excepthook")]:  # put back after the test, whatever it does
        monkeypatch.setattr(owner, name, getattr(owner, name))
    said = []
    a = Activity(lambda: None)
    data_waits.install(a, queues, lambda what, e: said.append((what, e)))
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
    threading.Timer(0.05, lambda: done.set()).start()  # (set by the job's code: the library's own sets are not noted)
    assert done.wait(5)  # the main thread, not in a call: its waits are its own business
    assert waits(activity) == []
    assert [DataWait.thread(m) for m in getattr(done._cond, data_waits.SET_BY)] == [threading.Timer.__name__ + "-1"] \
        or list(getattr(done._cond, data_waits.SET_BY))[0].startswith("~Thread-")


def test_what_only_pythons_library_sets_and_waits_on_is_not_noted(activity, queues):
    """Ray sets a concurrent.futures.Future, and waits on one, for every call of an async actor, from its
    compiled code: no frame of the job's is there, so neither is noted (each Future is new: noting them cost
    a look at its holder a call, and a wait entered for each). A Future the job waits on in its call is."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    setter = threading.Thread(target=future.set_result, args=(1,))  # (no frame of the job's sets it)
    setter.start()
    setter.join(5)
    assert data_waits.SET_BY not in vars(future._condition) and queues.now() == []

    def run():
        pending: concurrent.futures.Future = concurrent.futures.Future()
        threading.Timer(0.2, lambda: pending.set_result(2)).start()
        return pending.result(5)

    seen = []
    running = threading.Thread(target=lambda: seen.append(activity.tracked("run", run)()))
    running.start()
    deadline = time.monotonic() + 5
    while not waits(activity) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "in run (test_data_waits.py:" in waits(activity)[0].progress()
    running.join(5)
    assert seen == [2]


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


def test_a_queue_put_into_by_a_call_is_counted_with_its_depth_and_a_gate_is_no_queue(activity, queues):
    """A deque under a Condition (verl's MessageQueue's shape) and an asyncio.Queue, put into by calls: each
    a queue named by its holder's class and attribute, its depth read now and its puts counted; what was
    taken out follows. A gate's Condition (over a number) and an Event are none."""
    class MessageQueue:
        def __init__(self):
            self.samples, self.ready, self.arrived = collections.deque(), asyncio.Condition(), asyncio.Queue()
            self.version, self.gate = 0, asyncio.Condition()

        async def put_sample(self, n):
            calls.entered_async(asyncio.current_task(), "put_sample")
            async with self.ready:
                self.samples.append(n)
                self.ready.notify()
            await self.arrived.put(n)

        async def get_sample(self):
            calls.entered_async(asyncio.current_task(), "get_sample")
            async with self.ready:
                await self.ready.wait_for(lambda: self.samples)
                return self.samples.popleft()

    class Rollouter:
        def __init__(self):
            self.version, self.gate, self.opened = 0, asyncio.Condition(), asyncio.Event()

        async def update_param_version(self):
            calls.entered_async(asyncio.current_task(), "update_param_version")
            async with self.gate:
                self.version += 1
                self.gate.notify_all()
            self.opened.set()

    async def main():
        q, r = MessageQueue(), Rollouter()
        for n in range(5):
            await q.put_sample(n)
        await r.update_param_version()
        for _ in range(2):
            await q.get_sample()
        assert queues.now() == [QueueDepth("MessageQueue.arrived", 5, 5), QueueDepth("MessageQueue.samples", 3, 5)]

    asyncio.run(main())


def test_a_queue_queue_fed_by_a_thread_is_counted_by_its_puts_not_its_gets(activity, queues):
    """slime's shape: a producer thread puts into a ``queue.Queue`` its buffer holds; the collector's gets
    (which notify the queue's other Condition) are no puts. A queue the job let go of is forgotten."""
    class RolloutBuffer:
        def __init__(self):
            self.samples: queue.Queue = queue.Queue()

        def produce(self, n):
            for i in range(n):
                self.samples.put(i)

    buffer = RolloutBuffer()
    producer = threading.Thread(target=buffer.produce, args=(6,), name="rollout-producer")
    producer.start()
    producer.join()
    for _ in range(4):
        buffer.samples.get(timeout=1)
    assert queues.now() == [QueueDepth("RolloutBuffer.samples", 2, 6)]
    del buffer
    gc.collect()
    assert queues.now() == []


def test_a_call_polling_a_queue_its_own_thread_feeds_waits_on_what_that_thread_waits_on(activity):
    """slime's shape, alive: the producer is a thread of the actor's own, outside any call. A call polling its
    queue waits on whatever the thread waits on now: its gate (a Condition only a call of
    update_param_version sets), then its request to a server (a wait noted as http_calls notes one)."""
    samples: queue.Queue = queue.Queue()
    gate, state = threading.Condition(), {"version": 0, "answered": False}

    def update_param_version():
        with gate:
            state["version"] += 1
            gate.notify_all()

    def produce():
        samples.put({"n": 0})
        with gate:
            while state["version"] < 2:  # parked: the trainer's next version does not come
                gate.wait(0.2)
        token = activity.enter("HTTP POST", detail="waiting for POST /generate on 127.0.0.1:8000", wait=True,
                               waits_on=lambda: ["http POST 127.0.0.1:8000/generate @0"])
        deadline = time.monotonic() + 5
        while not state["answered"] and time.monotonic() < deadline:  # the request that does not return (a
            time.sleep(0.02)  # socket's read, no Condition), until the test lets it
        activity.leave(token)
        samples.put({"n": 1})

    def get_batch():
        batch = []
        while len(batch) < 2:
            try:
                batch.append(samples.get(timeout=0.2))
            except queue.Empty:
                continue
        return batch

    activity.tracked("update_param_version", update_param_version)()  # the gate's setter, known from then
    producer = threading.Thread(target=produce, name="rollout-producer", daemon=True)
    producer.start()
    polling = threading.Thread(target=activity.tracked("get_batch", get_batch), daemon=True)
    polling.start()

    def seen_on(edge: str) -> tuple[list[str], str]:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for w in waits(activity):
                on = w.waits_on()
                if w.name == "queue.Queue wait" and edge in on:
                    return on, w.progress()
            time.sleep(0.02)
        raise AssertionError(f"no wait of get_batch on {edge}: {[w.waits_on() for w in waits(activity)]}")

    on, said = seen_on(DataWait(("update_param_version",)).said())
    assert on == [DataWait(("~rollout-producer",)).said(), DataWait(("update_param_version",)).said()], on
    assert said.startswith("waiting on a queue.Queue in get_batch (test_data_waits.py:") and \
        "), fed by its thread rollout-producer, which is waiting on a threading.Condition in produce " \
        "(test_data_waits.py:" in said, said
    activity.tracked("update_param_version", update_param_version)()  # the gate opens: to the server
    on, said = seen_on("http POST 127.0.0.1:8000/generate @0")
    assert on == [DataWait(("~rollout-producer",)).said(), "http POST 127.0.0.1:8000/generate @0"], on
    assert said.endswith(", fed by its thread rollout-producer, which is waiting for POST /generate on "
                         "127.0.0.1:8000"), said
    state["answered"] = True
    polling.join(5)
    producer.join(5)
    assert data_waits.THREAD_WAITS == {}  # its waits were let go of as they ended


@pytest.mark.parametrize("first", ["queue", "gate"])
def test_a_call_parked_at_a_gate_is_shown_beside_an_older_one_on_a_queue(activity, first):
    """slime's shape with its producer a Ray task: the manager (a threaded actor) holds the trainer's
    get_sample polling its queue and the producer's pass_gate parked at its gate, two calls in two threads.
    Whichever began first, the phase shown is pass_gate at its gate (what feeds the queue passes it), with
    its own start and its wait's edge; the detail says the older call on the queue beside it."""
    samples: queue.Queue = queue.Queue()
    gate, state = threading.Condition(), {"version": 0, "stop": False}

    def update_param_version():
        with gate:
            gate.notify_all()

    def pass_gate():
        with gate:
            while not state["stop"]:
                gate.wait(0.1)

    def get_sample():
        while not state["stop"]:
            try:
                return samples.get(timeout=0.1)
            except queue.Empty:
                continue

    activity.tracked("update_param_version", update_param_version)()  # the gate's setter, known from then
    calls = {"queue": activity.tracked("get_sample", get_sample), "gate": activity.tracked("pass_gate", pass_gate)}
    threads = [threading.Thread(target=calls[kind], daemon=True) for kind in sorted(calls, key=lambda k: k != first)]
    try:
        threads[0].start()
        time.sleep(0.1)
        threads[1].start()
        deadline = time.monotonic() + 5
        while len(waits(activity)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(3 * TICK_S)  # (the watcher has taken both threads' calls)
        view = activity._view(time.time() + 1)  # (both lasted: the watcher's look a second on)
        assert (view.phase.name, view.about.name) == ("pass_gate", "threading.Condition wait"), view
        assert view.about.waits_on() == [DataWait(("update_param_version",)).said()]
        assert [c.name for c in view.in_flight] == (["get_sample", "pass_gate"] if first == "queue"
                                                    else ["pass_gate", "get_sample"])
        shown: list = []
        activity.reporter = types.SimpleNamespace(emit=shown.append)
        activity._show(view, view.about.detail, time.time())
        (phase,) = shown
        assert phase.phase == "pass_gate" and phase.started == view.phase.started and phase.in_flight == 2
        assert phase.detail == ("2 in flight (get_sample ×1, pass_gate ×1); pass_gate #1 at its gate, beside the "
                                "oldest (get_sample #1, on its queue): threading.Condition wait: waiting on a "
                                "threading.Condition"
                                if first == "queue" else
                                "2 in flight (pass_gate ×1, get_sample ×1); the oldest #1: threading.Condition wait: "
                                "waiting on a threading.Condition"), phase.detail
    finally:
        state["stop"] = True
        for t in threads:
            t.join(5)


def test_a_poll_is_one_wait_since_its_first_and_the_next_call_begins_its_own(activity):
    """A call polling a queue (a get with a timeout, again and again) waits once, since its first poll: its
    edges do not come and go with each poll. The next call in the same thread waits from its own start."""
    samples: queue.Queue = queue.Queue()

    def get_batch(polls):
        for _ in range(polls):
            try:
                samples.get(timeout=0.05)
            except queue.Empty:
                continue

    starts: list[float] = []  # the wait calls' starts, as the watcher would see them
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            starts.extend(w.started for w in waits(activity))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    first_call = time.time()
    activity.tracked("get_batch", get_batch)(6)
    second_call = time.time()
    activity.tracked("get_batch", get_batch)(2)
    stop.set()
    watcher.join(5)
    first = {started for started in starts if started < second_call}
    second = {started for started in starts if started >= second_call}
    assert activity.counts["queue.Queue wait"] == 8  # a wait call each poll, each seen from the first's start
    assert len(first) == 1 and first_call <= first.pop() < first_call + 0.05, starts
    assert len(second) == 1 and second.pop() >= second_call, starts


def test_the_samples_a_consumer_takes_are_counted_by_how_many_versions_behind_the_newest_they_were(
        activity, queues):
    """Samples that say their policy's version, in each kind of queue (a deque under a Condition, an
    asyncio.Queue, a thread's queue.Queue): those taken are counted by versions behind the newest put, the
    oldest taken first; a queue whose samples say none has no counts, and is not looked at again."""
    class Buffer:
        def __init__(self):
            self.samples, self.ready, self.arrived = collections.deque(), asyncio.Condition(), asyncio.Queue()
            self.plain: queue.Queue = queue.Queue()

        async def put_sample(self, sample):
            calls.entered_async(asyncio.current_task(), "put_sample")
            async with self.ready:
                self.samples.append(sample)
                self.ready.notify()
            await self.arrived.put(sample)

        def produce(self, n):
            for i in range(n):
                self.plain.put(f"text {i}")

    buffer = Buffer()

    async def main():
        for version in (0, 0, 1, 2, 3, 3):
            await buffer.put_sample({"n": version, "param_version": version})

    asyncio.run(main())
    producer = threading.Thread(target=buffer.produce, args=(3,), name="producer")
    producer.start()
    producer.join(5)
    for _ in range(4):  # the oldest four: 3, 3, 2 and 1 versions behind the newest (3)
        buffer.samples.popleft()
        buffer.arrived.get_nowait()
    buffer.plain.get(timeout=1)
    said = {q.name: q for q in queues.now()}
    assert said["Buffer.samples"] == QueueDepth("Buffer.samples", 2, 6, [0, 1, 1, 2, 0, 0])
    assert said["Buffer.arrived"].behind == [0, 1, 1, 2, 0, 0]
    assert said["Buffer.plain"] == QueueDepth("Buffer.plain", 2, 3, [])
    buffer.samples.clear()  # the rest taken: as behind as they were when taken (the newest is still 3)
    assert {q.name: q.behind for q in queues.now()}["Buffer.samples"] == [2, 1, 1, 2, 0, 0]
