"""A watched process's calls as its phases (gkd_core/integrations/activity.py), through a real Reporter
and a real ZeroMQ socket: shown once they last, with their real start; a wait inside a phase as that
phase's detail; a call too brief to be shown, after the fact; a flood of them, bounded."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from gkd_core.integrations.activity import BRIEF_BURST, BRIEF_PER_S, SHOW_AFTER_S, TICK_S, Activity
from gkd_core.telemetry.reporter import Reporter


class Received:
    def __init__(self, tmp_path):
        self.ctx = zmq.Context()
        self.pull = self.ctx.socket(zmq.PULL)
        self.addr = f"ipc://{tmp_path}/ingest.sock"
        self.pull.bind(self.addr)
        self.events: list[dict] = []

    def phases(self, wait_s: float = 0.3) -> list[dict]:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            while self.pull.poll(10):
                self.events.append(json.loads(self.pull.recv()))
        return [e for e in self.events if e["kind"] == "phase"]

    def close(self):
        self.pull.close(0)
        self.ctx.term()


@contextlib.contextmanager
def watched(tmp_path: Path, src: str):
    """An Activity reporting as ``src`` through a real Reporter to a real socket (its events read by the
    Received also given); closed after."""
    rx = Received(tmp_path)
    reporter = Reporter(src, ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    try:
        yield rx, activity
    finally:
        activity.close()
        reporter.close()
        rx.close()


@contextlib.contextmanager
def churning(call: Callable[[], Any], count: int):
    """Four threads making ``call`` (at most ``count`` times each) while the block runs, taking turns every few
    bytecodes: the races between them and the watcher come within the test."""
    stop = threading.Event()

    def churn():
        for _ in range(count):  # bounded
            if stop.is_set():
                return
            call()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for t in threads:
            t.start()
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        sys.setswitchinterval(switch)


def said_a_tiny_call_then_a_flood(phases: list[dict], tiny_at: float) -> list[str]:
    """The phases' names, once checked to open with a call too brief to show (sent after the fact, with its start
    and its number), then 500 calls within one tick: the newest of them, as many as the bucket held, not 500."""
    names = [p["phase"] for p in phases]
    assert names[:2] == ["tiny", "idle"] and abs(phases[0]["started"] - tiny_at) < 0.01 and phases[0]["call"] == 1
    assert phases[1]["started"] >= phases[0]["started"]
    floods = [p["call"] for p in phases if p["phase"] == "flood"]
    assert 1 <= len(floods) <= BRIEF_BURST and floods[-1] == 500
    return names


def test_calls_are_shown_once_they_last_with_their_start_and_waits_as_their_phases_detail(tmp_path):
    rx = Received(tmp_path)
    reporter = Reporter("Learner/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    try:
        tiny_at = time.time()
        t = activity.enter("tiny")  # shorter than SHOW_AFTER_S: sent after the fact, with its start and end
        activity.leave(t)
        time.sleep(3 * TICK_S)
        for _ in range(500):  # a flood of tiny calls within one tick: the newest sent, within the budget
            activity.leave(activity.enter("flood"))
        time.sleep(3 * TICK_S)
        t0 = time.time()
        outer = activity.enter("update_weights", step=3)
        time.sleep(SHOW_AFTER_S + 3 * TICK_S)
        wait = activity.enter("ray.get", detail="waiting for rollout/1.sync_rollout_weights", wait=True,
                              progress=lambda: "1 of 2 answered; waiting for rollout/1.sync_rollout_weights")
        time.sleep(SHOW_AFTER_S + 4 * TICK_S)
        activity.leave(wait)
        time.sleep(3 * TICK_S)
        activity.leave(outer)
        t1 = time.time()
        call = activity.enter("train")
        time.sleep(SHOW_AFTER_S + 3 * TICK_S)
        activity.leave(call)
        phases = rx.phases()
    finally:
        activity.close()
        reporter.close()
        rx.close()
    names = said_a_tiny_call_then_a_flood(phases, tiny_at)
    first = next(p for p in phases if p["phase"] == "update_weights")
    assert first["phase"] == "update_weights" and first["step"] == 3 and first.get("call") is None
    assert abs(first["started"] - t0) < 0.01  # its real start, not when it was first shown
    inside = [p for p in phases if p["phase"] == "update_weights" and "ray.get:" in p["detail"]]
    assert inside and inside[0]["started"] == first["started"]
    assert "1 of 2 answered" in inside[-1]["detail"]  # the wait's progress, asked by the watcher
    assert all(p["phase"] != "ray.get" for p in phases)  # a wait inside a phase is never a phase of its own
    train = [p for p in phases if p["phase"] == "train"]
    assert train and train[0]["call"] == 1 and train[0]["started"] >= t1
    assert names[-1] == "idle"  # after the last call, with its end


def test_methods_tracked_at_the_least_cost_show_as_any_call_does(tmp_path, capfd):
    """An actor's methods (``tracked``: a tuple in its thread's lane, made a Call by the watcher): a brief one
    after the fact with its start; a flood, the newest within the budget; one that lasts from its real start,
    with a wait inside it as its detail, and idle from its real end; one that raises, its error the caller's;
    threads churning through calls meanwhile never stop the watcher."""
    with watched(tmp_path, "Callee/0") as (rx, activity):
        def training(actor, step):
            time.sleep(SHOW_AFTER_S + 3 * TICK_S)
            wait = activity.enter("ray.get", detail="waiting for Inference/0.generate", wait=True)
            time.sleep(SHOW_AFTER_S + 4 * TICK_S)
            activity.leave(wait)
            return step + 1

        def failing(actor):
            raise ValueError("the job's own error")

        tiny, flood = activity.tracked("tiny", lambda actor: None), activity.tracked("flood", lambda actor: None)
        train, boom = activity.tracked("train", training), activity.tracked("boom", failing)
        tiny_at = time.time()
        tiny(None)
        time.sleep(3 * TICK_S)
        for _ in range(500):  # within one tick
            flood(None)
        time.sleep(3 * TICK_S)
        t0 = time.time()
        assert train(None, step=6) == 7
        t1 = time.time()
        time.sleep(3 * TICK_S)
        with pytest.raises(ValueError, match="own error"):
            boom(None)
        time.sleep(3 * TICK_S)
        with churning(lambda: tiny(None), 100_000):  # about a second of calls on each thread
            time.sleep(1.0)
        t2 = time.time()
        train(None, step=0)  # shown by a watcher still alive
        phases = rx.phases(0.5)
        assert "failed" not in capfd.readouterr().err
    names = said_a_tiny_call_then_a_flood(phases, tiny_at)
    first = next(p for p in phases if p["phase"] == "train")
    assert first["call"] == 1 and abs(first["started"] - t0) < 0.01  # its real start
    inside = [p for p in phases if p["phase"] == "train" and "ray.get:" in p["detail"]]
    assert inside and inside[0]["started"] == first["started"] and "Inference/0.generate" in inside[0]["detail"]
    idle = phases[names.index("idle", names.index("train"))]
    assert t1 - 0.01 < idle["started"] <= t1  # from its real end
    assert "boom" in names  # brief, and ended though it raised
    last = [p for p in phases if p["phase"] == "train"][-1]
    assert last["call"] == 2 and last["started"] >= t2 and names[-1] == "idle"


def test_a_steady_stream_of_brief_calls_is_sampled_within_the_budget(tmp_path):
    """A thousand calls a second, too brief to show, for two seconds: the bucket's worth and BRIEF_PER_S a
    second after it are sent, each the newest at its tick; a call a second is sent every time."""
    rx = Received(tmp_path)
    reporter = Reporter("Callee/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:  # bounded: two seconds
            activity.leave(activity.enter("answer"))
            time.sleep(0.001)
        time.sleep(1.0)  # the bucket refills meanwhile; then one call a second, three times
        for _ in range(3):
            activity.leave(activity.enter("step_sync"))
            time.sleep(1.0)
        phases = rx.phases(0.3)
    finally:
        activity.close()
        reporter.close()
        rx.close()
    answers = [p for p in phases if p["phase"] == "answer"]
    assert 1 <= len(answers) <= BRIEF_BURST + 2.0 * BRIEF_PER_S + 1, len(answers)
    assert [p["phase"] for p in phases].count("step_sync") == 3


def test_a_wait_says_whom_it_waits_for():
    from gkd_core.integrations.waits import _names

    assert _names([("rollout/1", "sync_rollout_weights")]) == "rollout/1.sync_rollout_weights"
    assert _names([("Learner/3", "train"), ("Learner/9", "train"), None]) == \
        "train of Learner/3, Learner/9, 1 other object(s)"
    many = [(f"Learner/{i}", "train") for i in range(9)]
    assert _names(many).endswith("Learner/5 … (+3)")


def test_threads_making_brief_calls_all_the_while_do_not_stop_the_watcher(tmp_path, capfd):
    """An actor's threads end calls while the watcher takes the brief ones: it must go on showing calls
    (a deque iterated while another thread appends raises, and a watcher that died showed nothing more)."""
    rx = Received(tmp_path)
    reporter = Reporter("Learner/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    try:
        with churning(lambda: activity.leave(activity.enter("tiny")), 200_000):  # about 2 s on each thread
            time.sleep(2.0)
        t = activity.enter("train")  # shown by a watcher still alive
        time.sleep(SHOW_AFTER_S + 4 * TICK_S)
        activity.leave(t)
        phases = rx.phases(0.5)
        assert any(p["phase"] == "train" for p in phases), phases[-5:]
        assert "failed" not in capfd.readouterr().err
    finally:
        activity.close()
        reporter.close()
        rx.close()


def test_calls_in_flight_at_once_show_as_the_oldest_with_their_count_and_their_awaits_on_request(tmp_path):
    """An async server's eight calls at once, one of which never returns: the phase is the oldest call,
    since its start, with eight in flight; once the seven others return, the stuck one is still the phase,
    its age unchanged; and a capture that asks gets each coroutine's chain of awaits down to the line
    it waits at."""
    import asyncio

    from gkd_core.node.stacks import task_stack_files, via_task_stacks

    rx = Received(tmp_path)
    reporter = Reporter("Server/2", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    activity.answer_task_stacks(tmp_path / "stacks")
    loop = asyncio.new_event_loop()
    never = asyncio.Event()  # set only at the end, from the loop's own thread
    returned = asyncio.Event()

    async def generate(n: int) -> int:
        if n == 0:
            await never.wait()  # the stuck request
        else:
            await returned.wait()
        return n

    async def served(n: int) -> int:  # as ray_hook's wrapper: the call's coroutine is its lane
        coro = generate(n)
        token = activity.enter("generate", lane=coro)
        try:
            return await coro
        finally:
            activity.leave(token)

    thread = threading.Thread(target=loop.run_forever, name="AsyncIO Thread: default", daemon=True)
    thread.start()
    try:
        assert not task_stack_files(tmp_path / "stacks", os.getpid()).ready.exists()  # nothing async yet
        first_at = time.time()
        futures = [asyncio.run_coroutine_threadsafe(served(n), loop) for n in range(8)]

        def eight() -> list[dict]:  # (a count seen short at the first show is said again at the next second)
            shown = [p for p in rx.phases(0.1) if p["phase"] == "generate"]
            return shown if shown and shown[-1].get("in_flight") == 8 else []

        deadline = time.monotonic() + 3.0
        while not (shown := eight()) and time.monotonic() < deadline:
            pass
        assert shown, rx.events[-3:]
        assert 0 <= shown[-1]["started"] - first_at < 0.5 and shown[-1]["call"] == 1  # the oldest: the stuck one
        assert shown[-1]["detail"].startswith("8 in flight (generate ×8); the oldest #1")

        loop.call_soon_threadsafe(returned.set)  # seven return; the stuck one stays
        for f in futures[1:]:
            f.result(timeout=5)
        time.sleep(1.5)  # a change of count alone is said at the next progress tick (PROGRESS_EVERY_S)
        after = rx.phases()
        assert after[-1]["phase"] == "generate" and after[-1]["call"] == 1
        assert after[-1].get("in_flight", 0) == 0 and after[-1]["started"] == shown[-1]["started"]

        text = via_task_stacks(os.getpid(), tmp_path / "stacks", 2.0)
        line = next(i for i, s in enumerate(Path(__file__).read_text().splitlines(), 1) if "the stuck request" in s)
        assert text.startswith("Task generate #1 (asyncio), in flight "), text
        assert f'File "{__file__}", line {line} in generate' in text and "await never.wait()" in text, text
        assert "  awaiting a Future (pending" in text, text
        from gkd_core import stack_text

        assert stack_text.where(text).startswith("`generate` (test_activity.py:"), stack_text.where(text)
    finally:
        loop.call_soon_threadsafe(never.set)
        time.sleep(0.1)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        activity.close()
        reporter.close()
        rx.close()


def test_a_wait_is_only_noted_until_it_lasts_then_shown_from_its_start_and_ended_as_a_call(tmp_path):
    """The main thread's waits, as ray_hook's wrapper notes them (``Activity.main_wait``): one that returns at
    once is never made a call and sends nothing; one that lasts is made one by the watcher, shown as its
    phase's detail, and ended as a call (its Wait's end: the refs let go); one
    that ends while the watcher makes it is dropped there, never shown."""
    from gkd_core.integrations.waits import RefBook, Wait

    rx = Received(tmp_path)
    reporter = Reporter("Trainer/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    made: list[Wait] = []

    def make_wait(noted: tuple) -> Wait:  # as ray_hook's ``make_wait``: a Wait of the noted refs
        made.append(Wait(RefBook(), list(noted[2]), reporter.emit, None, None, started=noted[1]))
        return made[-1]

    def waited(seconds: float) -> float:  # as ray_hook's wrapper, around a wait of ``seconds``
        noted = ("ray.get", time.time(), [], {})
        outer, activity.main_wait = activity.main_wait, noted
        if activity.asleep:
            activity.wake()
        time.sleep(seconds)
        activity.main_wait = outer
        if activity.waits_made:
            activity.wait_ended(noted, None)
        return noted[1]

    activity.make_wait = make_wait
    try:
        step = activity.enter("step")
        time.sleep(SHOW_AFTER_S + 3 * TICK_S)  # the step shown
        for _ in range(50):
            waited(0.0005)  # each well within SHOW_AFTER_S
        assert made == [] and activity.waits_made == {}
        began = waited(SHOW_AFTER_S + 4 * TICK_S)
        assert len(made) == 1 and activity.waits_made == {} and made[0]._over  # made once, then ended
        time.sleep(3 * TICK_S)
        activity.leave(step)
        phases = rx.phases()

        noted = ("ray.get", time.time() - 1.0, [], {})  # the race: the wait ends while the watcher makes it

        def ended_meanwhile(noted: tuple) -> Wait:
            activity.main_wait = None  # (the main thread, between the watcher's look and its note)
            return make_wait(noted)

        activity.make_wait = ended_meanwhile
        activity.main_wait = noted
        activity._make_main_wait(time.time())
        assert activity.waits_made == {} and activity._active == {}  # dropped, never shown
    finally:
        activity.close()
        reporter.close()
        rx.close()
    inside = [p for p in phases if p["phase"] == "step" and "ray.get:" in p["detail"]]
    assert inside and "all 0 answered" in inside[0]["detail"], phases
    back = [p for p in phases if p["phase"] == "step" and "ray.get" not in p["detail"]]
    assert back[-1]["ts"] >= began + SHOW_AFTER_S + 4 * TICK_S  # the step alone again, once the wait returned
    assert all(p["phase"] != "ray.get" for p in phases)


def test_a_wait_whose_making_fails_is_tried_once_and_the_next_wait_is_made(tmp_path):
    """A failure of ours in making a Wait (``make_wait`` raises) is tried once for that wait, not at every tick
    while it lasts; the next wait is made as usual."""
    from gkd_core.integrations.waits import RefBook, Wait

    activity = Activity(lambda: None)
    tries: list[tuple] = []

    def failing(noted: tuple) -> Wait:
        tries.append(noted)
        raise RuntimeError("ours")

    activity.make_wait = failing
    noted = ("ray.get", time.time() - 1.0, [], {})
    activity.main_wait = noted
    for _ in range(3):
        try:
            activity._make_main_wait(time.time())
        except RuntimeError:
            pass
    assert len(tries) == 1 and activity.waits_made == {}
    activity.make_wait = lambda n: Wait(RefBook(), [], lambda e: None, None, None, started=n[1])
    later = ("ray.get", time.time() - 1.0, [], {})
    activity.main_wait = later
    activity._make_main_wait(time.time())
    assert list(activity.waits_made) == [id(later)]
    activity.main_wait = None
    activity.wait_ended(later, None)
    assert activity.waits_made == {} and activity._active == {}
