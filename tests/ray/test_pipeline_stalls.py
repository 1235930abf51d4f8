"""An async RL pipeline (tests/jobs/ray_async_pipeline.py under `gkd-tui launch --`: an inference server in a
Ray actor, a tool outside Ray, a rollouter behind a staleness gate, a message queue, two trainer ranks over
gloo) stalled by one cause at a time: each named as itself (tests/pipeline_stalls.py); and the same pipeline
left healthy for two minutes says nothing, while its waits on the queue and whom each sends calls to are on
the record. And slime's shape: the four causes where the producer is a thread of the queue's actor, and a
producer thread that dies with an error, its collector polling on."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from conftest import gkd_tui, logged_events, wait_until
from pipeline_stalls import (
    CAUSES,
    HEALTHY_S,
    NAMED_WITHIN_S,
    alarms,
    launched,
    said,
    stalled_and_named,
)

from gkd_core import rundir
from gkd_core.telemetry.events import STALENESS_BUCKETS

STILL_HEALTHY_S = 120  # #55: the same job left healthy this long says nothing
THREAD_JOB = Path(__file__).resolve().parents[1] / "jobs" / "ray_thread_producer.py"


@pytest.mark.parametrize("cause", list(CAUSES))
@pytest.mark.timeout(HEALTHY_S + 240)
def test_each_cause_of_a_stalled_pipeline_is_named_as_itself_and_the_trainer_is_blocked_by_it(gkd_home, cause):
    stalled_and_named(cause)


@pytest.mark.parametrize("cause", ["tool", "gate"])
@pytest.mark.timeout(HEALTHY_S + 240)
def test_each_cause_is_named_as_itself_in_slimes_shape_where_the_producer_is_a_thread(gkd_home, cause):
    """The queue and the rollouter one threaded actor (slime's rollout manager): its producer a thread of its
    own, its requests over urllib, its collector polling a queue.Queue with a timeout. The two causes whose
    naming goes through the producer (a stalled server or rank names the same workers as in the plain shape,
    SLIME_CAUSES, and passes here too: left out of CI's time)."""
    stalled_and_named(cause, "--slime")


@pytest.mark.parametrize("cause", ["tool", "gate"])
@pytest.mark.timeout(HEALTHY_S + 240)
def test_each_cause_is_named_as_itself_where_slimes_producer_is_a_ray_task(gkd_home, cause):
    """slime's shape with its producer a Ray task that runs until the job ends: the task's worker is one of the
    run's, named by its function (``produce/0``), its requests and the calls it sends the pipeline's. The two
    causes whose naming goes through the producer (a stalled server or rank is named as itself whatever the
    producer is: both pass here too, SLIME_TASK_CAUSES)."""
    stalled_and_named(cause, "--slime-tasks")


@pytest.mark.timeout(STILL_HEALTHY_S + 180)
def test_the_same_pipeline_left_healthy_for_two_minutes_says_nothing(gkd_home):
    run = launched(STILL_HEALTHY_S, "none")
    try:
        wait_until(lambda: said(run, "STALLED AT"), STILL_HEALTHY_S + 150, "two healthy minutes", every_s=2.0)
        events = logged_events(run)
        assert [(a["code"], a["message"]) for a in alarms(run)] == []
        # it was watched all along: its steps' waits on the queue and the gate's data are on the record
        trainers = [e for e in events if e["kind"] == "phase" and e["src"].startswith("Trainer/")]
        assert any(w.startswith("MessageQueue/0.get_sample") for e in trainers for w in e.get("waits_on") or [])
        sends = {e["src"]: e["to"] for e in events if e["kind"] == "sends"}
        assert "MessageQueue/0.put_sample" in sends.get("Rollouter/0", []), sends
        assert "Rollouter/0.update_param_version" in sends.get("Trainer/0", []), sends
        # the pipeline pane's numbers: the queue found where put_sample notifies its Condition, its puts going up
        # with the samples; the server's served requests counted by route
        puts_at = [(e["ts"], q[2]) for e in events if e["kind"] == "flow" and e["src"] == "MessageQueue/0"
                   for q in e["queues"] if q[0] == "MessageQueue.samples"]
        puts = [n for _, n in puts_at]
        assert len(puts) > 10 and puts == sorted(puts) and puts[-1] > 100, puts[-5:]
        served_at = [(e["ts"], e["calls"].get("POST /generate", 0)) for e in events if e["kind"] == "flow"
                     and e["src"] == "InferenceServer/0"]
        assert served_at
        # every sample put was generated first: the served requests said at a moment are at least the puts said
        # by then (each process says its counts on its own clock: the queue's last word may come after the
        # server's, with the samples of a few more requests)
        when, served = served_at[-1]
        put_by_then = max((n for ts, n in puts_at if ts <= when), default=0)
        assert served >= put_by_then > 100, (served_at[-1:], put_by_then)
        # the samples say their version: those the trainers took, by how many versions behind the newest put
        # they were; the gate keeps them within a few (none STALENESS_BUCKETS or more behind)
        behind = [q[3] for e in events if e["kind"] == "flow" and e["src"] == "MessageQueue/0"
                  for q in e["queues"] if q[0] == "MessageQueue.samples"][-1]
        assert len(behind) == STALENESS_BUCKETS and sum(behind) > 100 and behind[-1] == 0, behind
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)


@pytest.mark.timeout(200)
def test_a_producer_thread_that_dies_is_named_with_its_error_while_the_collector_polls_on(gkd_home):
    """slime's shape (tests/jobs/ray_thread_producer.py): a buffer actor's own thread fills a queue.Queue, its
    collector call polls it with a timeout; the thread raises. The buffer is named, with the thread and its
    error, within 15 s; nothing before."""
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(THREAD_JOB), str(HEALTHY_S))
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        dies_at = float(wait_until(lambda: said(run, "STALLED AT"), 120, "the job to start", every_s=1.0))
        named = wait_until(lambda: alarms(run), dies_at - time.time() + NAMED_WITHIN_S + 30, "the death named",
                           every_s=0.5)
        first = named[0]
        assert first["ts"] >= dies_at and first["ts"] - dies_at <= NAMED_WITHIN_S, (first["ts"] - dies_at, first)
        assert (first["code"], first["targets"]) == ("producer_died", ["RolloutBuffer/0"]), first
        assert re.search(r"only its thread rollout-producer fed, which has ended with ValueError: sample \d+ has no "
                         r"reward: the reward model answered None", first["message"]), first["message"]
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)
