"""A watched process's calls as its phases (gkd_core/integrations/activity.py), through a real Reporter
and a real ZeroMQ socket: shown once they last, with their real start; a wait inside a phase as that
phase's detail; a call too brief to be shown, after the fact; a flood of them, bounded."""

from __future__ import annotations

import json
import sys
import time

import zmq

from gkd_core.integrations.activity import SHOW_AFTER_S, TICK_S, Activity
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


def test_calls_are_shown_once_they_last_with_their_start_and_waits_as_their_phases_detail(tmp_path):
    rx = Received(tmp_path)
    reporter = Reporter("Learner/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    try:
        tiny_at = time.time()
        t = activity.enter("tiny")  # shorter than SHOW_AFTER_S: sent after the fact, with its start and end
        activity.leave(t)
        time.sleep(3 * TICK_S)
        for _ in range(500):  # a flood of tiny calls within one tick: at most BRIEF_PER_TICK of them sent
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
    names = [p["phase"] for p in phases]
    assert names[:2] == ["tiny", "idle"] and abs(phases[0]["started"] - tiny_at) < 0.01
    assert phases[1]["started"] >= phases[0]["started"]
    assert 1 <= names.count("flood") <= 2 and [p["call"] for p in phases if p["phase"] == "flood"][-1] == 500
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
    import threading

    rx = Received(tmp_path)
    reporter = Reporter("Learner/0", ingest=rx.addr, heartbeat_s=60)
    activity = Activity(lambda: reporter)
    stop = threading.Event()

    def churn():
        for _ in range(200_000):  # bounded; about 2 s of calls on each thread
            if stop.is_set():
                return
            activity.leave(activity.enter("tiny"))

    threads = [threading.Thread(target=churn) for _ in range(4)]
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads taking turns every few bytecodes: the race comes within the test
    try:
        for t in threads:
            t.start()
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(10)
        t = activity.enter("train")  # shown by a watcher still alive
        time.sleep(SHOW_AFTER_S + 4 * TICK_S)
        activity.leave(t)
        phases = rx.phases(0.5)
        assert any(p["phase"] == "train" for p in phases), phases[-5:]
        assert "failed" not in capfd.readouterr().err
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        activity.close()
        reporter.close()
        rx.close()
