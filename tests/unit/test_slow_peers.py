"""A worker slower than its peers step after step (gkd_core/diagnosis/slow_peers.py): three times slower than its
peer in most of the last steps is warned as itself, with both times; noise, or one slow step, is not; an instance is
judged once."""

from __future__ import annotations

import random

from gkd_core import diagnosis
from gkd_core.diagnosis import slow_peers
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

T0 = 1000.0


def two_rollouts(times: list[tuple[float, float]]) -> tuple[RunState, float]:
    """Steps of two rollouts' generate, each step's times given, then idle, a weight sync and idle again (as our
    trainer's: four spans a step, so that a worker's kept spans hold a few steps only); the run's clock after."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 10))
    for src in ("rollout/0", "rollout/1"):
        st.apply(ev.WorkerEvent(src=src, role="rollout", rank=int(src[-1]), pid=7, node="n1", ts=T0 - 9))
    t = T0
    for step, pair in enumerate(times, 1):
        for src, took in zip(("rollout/0", "rollout/1"), pair, strict=True):
            st.apply(ev.PhaseEvent(src=src, phase="generate", step=step, started=t, ts=t))
            st.apply(ev.PhaseEvent(src=src, phase="idle", step=step, started=t + took, ts=t + took))
        t += max(pair) + 0.01
        for src in ("rollout/0", "rollout/1"):
            st.apply(ev.PhaseEvent(src=src, phase="sync_weights", step=step, started=t, ts=t))
            st.apply(ev.PhaseEvent(src=src, phase="idle", step=step, started=t + 0.005, ts=t + 0.005))
        t += 0.01
        if step % 2 == 0:  # the diagnosis looks every few steps (every 0.5 s): what it saw then is what it judges
            slow(st, t)
    for src in ("rollout/0", "rollout/1"):
        st.apply(ev.HeartbeatEvent(src=src, ts=t, phase="idle"))
    return st, t


def slow(st: RunState, now: float) -> list:
    return [a for a in diagnosis.diagnose(st, now) if a.code == "slower_than_peers"]


def test_three_times_slower_in_most_of_the_last_steps_is_warned_with_both_times():
    st, now = two_rollouts([(0.021, 0.022)] * 10 + [(0.021, 0.063)] * 5)
    assert slow(st, now) == []  # slow in 5 of the last 8: not yet
    st, now = two_rollouts([(0.021, 0.022)] * 10 + [(0.021, 0.063)] * 6)
    [a] = slow(st, now)
    assert (a.targets, a.severity) == (["rollout/1"], "warn")
    assert a.message.startswith("rollout/1 is 3.0x slower than its peers in generate: 63 ms against their 21 ms "
                                "(medians), in 6 of its last 8 steps; every step waits for it [pid 7 on n1]"), a.message
    st, now = two_rollouts([(0.021, 0.022)] * 10 + [(0.021, 0.05)] * 8)  # 2.4 times: a busy node's noise, not named
    assert slow(st, now) == []
    assert a.evidence["slow_in"] == 6 and a.evidence["ratio"] == 3.0


def test_a_restart_begins_anew_and_its_first_steps_warm_up():
    """The run started again (from its checkpoint, its steps said again): what was judged before is of processes
    gone, and so are the spans a worker kept from before it; the new ones' first steps (imports, caches) are not
    judged."""
    st, now = two_rollouts([(0.021, 0.022)] * 4 + [(0.021, 0.063)] * 8)
    assert len(slow(st, now)) == 1
    st.apply(ev.RunEvent(state="running", restart=1, ts=now + 1))
    t = now + 2
    for step in range(5, 12):  # from the checkpoint of step 4: slow in the first 4 (warming up), then 3 more
        for src, took in (("rollout/0", 0.021), ("rollout/1", 0.063)):
            st.apply(ev.PhaseEvent(src=src, phase="generate", step=step, started=t, ts=t))
            st.apply(ev.PhaseEvent(src=src, phase="idle", step=step, started=t + took, ts=t + took))
        t += 0.1
        assert slow(st, t) == []

    class Spans:  # a straggler index that kept twelve slow steps of spans from before a restart at T0 + 100
        role_size = {"rollout": 2}
        at_work: dict = {}
        finished = {"rollout": {("generate", k): {"rollout/0": (T0 + k, 0.021), "rollout/1": (T0 + k, 0.063)}
                                for k in range(1, 13)}}

    assert slow_peers.SlowIndex().slow_workers(Spans(), T0 - 10)  # (read as this run's: named)
    assert slow_peers.SlowIndex().slow_workers(Spans(), T0 + 100) == []  # the run before a restart's: not judged


def test_noise_and_a_slow_step_now_and_then_are_not_slowness():
    rng = random.Random(7)
    noisy = [(rng.uniform(0.015, 0.03), rng.uniform(0.015, 0.03)) for _ in range(40)]
    noisy[20] = (0.021, 0.2)  # a pause (a collection, a page fault) in one step
    noisy[35] = (0.3, 0.021)
    st, now = two_rollouts(noisy)
    assert slow(st, now) == []
    st, now = two_rollouts([(0.0004, 0.0012)] * 10)  # a phase of a few calls: under the floor, not judged
    assert slow(st, now) == []


def test_a_finished_instance_is_judged_once():
    judged = []
    real = slow_peers._judge

    def counted(members):
        judged.append(len(members))
        return real(members)

    slow_peers._judge = counted
    try:
        st, now = two_rollouts([(0.021, 0.022)] * 4 + [(0.021, 0.063)] * 8)  # (the first 4 warm up: not judged)
        assert len(slow(st, now)) == 1 and len(judged) == 16  # each step's generate and sync, once
        assert len(slow(st, now + 1)) == 1 and len(judged) == 16  # nothing ended since: nothing judged again
    finally:
        slow_peers._judge = real
