"""The straggler rule's kept index (``SpanIndex``) finds what a fresh one finds, at every moment.

The supervisor keeps one index for its RunState and updates it from the workers that moved since the
last pass; a fresh index reads every span. Random event streams (phases with and without steps, a
phase entered again at the same step, re-registrations that change a role, runs that end and start
again, spans older than SPANS_KEEP dropped) are applied, and at random moments both must name the same
late workers, the same way.
"""

from __future__ import annotations

import random

import pytest

from gkd_core.diagnosis import stragglers
from gkd_core.diagnosis.stragglers import SpanIndex, late_workers
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

PHASES = ["generate", "train", "sync_weights", "teacher_wait", "idle", "init", "call_x", "ready"]


def run_stream(seed: int, workers: int, events: int) -> int:
    """Applies a random stream and compares at random moments; returns how many comparisons found someone."""
    rnd = random.Random(seed)
    srcs = [f"rollout/{i}" for i in range(workers)] + ["teacher/0", "teacher/1", "driver"]
    state, kept = RunState(state="running"), SpanIndex()
    t, step, found = 1000.0, 0, 0
    for _ in range(events):
        t += rnd.choice([0.0, rnd.uniform(0, 0.5), rnd.uniform(0, 4), rnd.uniform(0, 20)])
        r, src = rnd.random(), rnd.choice(srcs)
        if r < 0.03:
            state.apply(ev.WorkerEvent(src=src, role=rnd.choice(["rollout", "teacher", "odd", ""]), ts=t))
        elif r < 0.04:
            state.apply(ev.RunEvent(state=rnd.choice(["running", "failed", "stopped"]), ts=t))
        else:
            step += rnd.random() < 0.1
            state.apply(ev.PhaseEvent(src=src, phase=rnd.choice(PHASES), ts=t,
                                      step=rnd.choice([step, step, None]),
                                      started=t - rnd.uniform(0, 3) if rnd.random() < 0.1 else None))
        if rnd.random() < 0.2:
            now = t + rnd.choice([0, 1, 5.5, 12, 30, 80])
            got = late_workers(state, now, kept)
            assert got == late_workers(state, now, SpanIndex()), (seed, now)
            found += bool(got)
    return found


@pytest.mark.parametrize("seed", range(40))
def test_a_kept_index_names_what_a_fresh_one_names(seed):
    assert run_stream(seed, workers=2 + seed % 12, events=600) > 0  # the streams do make late workers


def test_the_same_with_hundreds_of_workers_a_call():
    """Hundreds of workers in one stepless call: the shared medians of a window, and the shortcut for
    a call that fewer than half of anyone's peers finished."""
    assert run_stream(7, workers=400, events=4000) > 0


def test_a_worker_whose_spans_are_replaced_is_read_afresh():
    state = RunState(state="running")
    for i in range(4):
        state.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=1, ts=100.0))
        if i < 3:
            state.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="train", step=1, ts=101.0))
    kept = SpanIndex()
    before = late_workers(state, 140.0, kept)
    w = state.workers["rollout/0"]
    w.spans = []  # not by the reducer: other objects, so the index reads them again
    state.mark_moved(w)
    assert sorted(late_workers(state, 140.0, kept)) == sorted(late_workers(state, 140.0, SpanIndex()))
    assert [late.src for late in before] == ["rollout/3"]  # 40 s where its peers took 1 s


def test_a_reader_that_keeps_fewer_spans():
    """The dashboard keeps none (``spans_keep=0``); trimming a state's spans is read by the kept index."""
    state, bare = RunState(state="running"), RunState(state="running", spans_keep=0)
    for t in range(40):
        for s in (state, bare):
            s.apply(ev.PhaseEvent(src=f"rollout/{t % 3}", phase=PHASES[t % 4], step=t // 4, ts=100.0 + t))
    assert all(len(w.spans) >= 12 for w in state.workers.values())
    assert all(not w.spans for w in bare.workers.values())
    assert [(w.phase, w.step, w.phase_since) for w in bare.workers.values()] == \
        [(w.phase, w.step, w.phase_since) for w in state.workers.values()]
    kept = SpanIndex()
    late_workers(state, 200.0, kept)
    state.keep_spans(2)
    assert all(len(w.spans) == 2 for w in state.workers.values())
    assert sorted(late_workers(state, 300.0, kept)) == sorted(late_workers(state, 300.0, SpanIndex()))
    assert kept.finished == _fresh(state).finished


def _fresh(state: RunState) -> SpanIndex:
    index = SpanIndex()
    index.update(state)
    return index


def test_keep_up_reads_what_the_state_fed_a_slice_at_a_time_and_a_pass_over_nothing_changed_reads_none(monkeypatch):
    """Between passes the supervisor reads moved workers a slice a tick (keep_up), as the state feeds them: no walk
    over every worker to find them, and nothing read when nothing moved."""
    monkeypatch.setattr(stragglers, "KEEP_UP_BUDGET", 3)
    read: list[str] = []
    move = SpanIndex._move
    monkeypatch.setattr(SpanIndex, "_move", lambda self, w: (read.append(w.src), move(self, w)))
    state = RunState(state="running")
    for i in range(4):
        state.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=1, ts=1000.0))
        state.apply(ev.HeartbeatEvent(src=f"rollout/{i}", ts=1000.1))
    stragglers.keep_up(state)
    assert len(read) == 3  # a slice
    stragglers.keep_up(state)
    assert sorted(read) == [f"rollout/{i}" for i in range(4)]
    read.clear()
    stragglers.keep_up(state)
    assert stragglers.late_workers(state, 1001.0) == [] and read == []  # nothing moved: nobody read
    state.apply(ev.PhaseEvent(src="rollout/0", phase="train", step=1, ts=1001.0))
    state.apply(ev.HeartbeatEvent(src="rollout/2", ts=1001.5))  # (a beat feeds nobody)
    assert stragglers.late_workers(state, 1002.0) == [] and read == ["rollout/0"]
