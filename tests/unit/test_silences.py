"""The silences' watch (gkd_core/diagnosis/silences.py) says what a walk over every worker says, reading only what
changed or came due."""

from __future__ import annotations

import random

import pytest

from gkd_core.diagnosis.silences import SilenceWatch, silent_workers
from gkd_core.state import RunState
from gkd_core.state.liveness import Limits, silent_among
from gkd_core.telemetry import events as ev

T0 = 1_000_000.0


def walked(st: RunState, now: float, limits: Limits) -> list[tuple[str, str]]:
    return [(w.src, j.word) for w, j in silent_among(st, st.workers.values(), now, limits)]


def watched(st: RunState, now: float, limits: Limits) -> list[tuple[str, str]]:
    return [(w.src, j.word) for w, j in silent_workers(st, now, limits)]


class RandomRun:
    """Workers, half of them behind node relays, that beat, fall silent, come back, change phase, end and start
    again; relays whose clocks go on, stop, and start again under a new epoch; rosters that join and go quiet."""

    def __init__(self, seed: int, workers: int = 40, relays: int = 4):
        self.rnd = random.Random(seed)
        self.st = RunState()
        self.now = T0
        self.relays = [f"agent/n{i}" for i in range(relays)]
        self.epoch = {r: T0 for r in self.relays}
        self.relay_live = dict.fromkeys(self.relays, True)
        self.st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=10.0))
        self.workers = []
        for i in range(workers):
            via = self.relays[i % relays] if i % 2 else ""
            src = f"rollout/{i}"
            self.workers.append((src, via))
            self.st.apply(ev.WorkerEvent(src=src, role="rollout", rank=i, node=f"n{i % relays}", pid=100 + i,
                                         via=via, ts=T0))
        self.beating = {src: self.rnd.random() < 0.9 for src, _ in self.workers}

    def step(self) -> None:
        rnd, st = self.rnd, self.st
        self.now += rnd.choice((0.05, 0.3, 0.7, 1.0, 1.6, 2.5))
        now = self.now
        for r in self.relays:
            if rnd.random() < 0.03:
                self.relay_live[r] = not self.relay_live[r]
            if rnd.random() < 0.01:
                self.epoch[r] = now  # started again
        for src, _ in self.workers:
            if rnd.random() < 0.04:
                self.beating[src] = not self.beating[src]
            if rnd.random() < 0.05:
                st.apply(ev.PhaseEvent(src=src, phase=rnd.choice(("generate", "train", "idle", "exited", "init")),
                                       ts=now - rnd.random()))
        by_relay: dict[str, list[ev.Beat]] = {r: [] for r in self.relays}
        for src, via in self.workers:
            if not self.beating[src] or rnd.random() < 0.3:
                continue
            if via and self.relay_live[via]:
                if rnd.random() < 0.15:  # a full beat (the others are the relay's clock)
                    by_relay[via].append(ev.Beat(src, now - rnd.random() * 0.5, "generate"))
            elif not via:
                st.apply(ev.HeartbeatEvent(src=src, ts=now - rnd.random() * 0.5))
        for r in self.relays:
            if not self.relay_live[r]:
                continue
            members = [s for s, v in self.workers if v == r]
            joined = tuple(s for s in members if rnd.random() < 0.1)
            quiet = tuple((s, now - 5.0) for s in members if rnd.random() < 0.03 and s not in joined)
            st.apply(ev.HeartbeatsEvent(src=r, ts=now, beats=by_relay[r],
                                        clocks=[ev.RelayClock(r, self.epoch[r], now - rnd.random(), joined, quiet)]))


@pytest.mark.parametrize("seed", range(12))
def test_the_watch_says_what_the_walk_says(seed):
    """Passes now and then, with what came between them taken in a few at a time (``keep_up``) or not."""
    run = RandomRun(seed)
    limits = Limits(heartbeat_s=1.0, stall_s=10.0)
    keep_up = seed % 2 == 1
    for _ in range(300):
        run.step()
        if keep_up and run.st.kept_if("silences") is not None:
            run.st.kept("silences", lambda: None).keep_up(run.st, run.now, run.rnd.choice((1, 3, 100)))
        for now in (run.now, run.now + run.rnd.random() * 4):  # a pass later than the newest event too
            assert watched(run.st, now, limits) == walked(run.st, now, limits)


def test_a_pass_over_nothing_changed_reads_no_worker_and_a_deadline_is_found_without_a_change():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=10.0))
    for i in range(1000):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", node=f"n{i // 8}", via=f"agent/n{i // 8}", ts=T0))
    beats = [ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 1, beats=[ev.Beat(f"rollout/{i}", T0 + 1)
                                                                    for i in range(8 * n, 8 * n + 8)],
                                clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 1.2, tuple(f"rollout/{i}" for i in
                                                                                      range(8 * n, 8 * n + 8)))])
             for n in range(125)]
    for b in beats:
        st.apply(b)
    limits = Limits()
    watch = st.kept("silences", lambda: SilenceWatch(st))
    assert watched(st, T0 + 1.5, limits) == []
    read = watch.read
    assert watched(st, T0 + 1.6, limits) == [] and watched(st, T0 + 2.0, limits) == []
    assert watch.read == read  # nothing changed, nothing came due: no worker read
    # the relays go on: each relay's clock is read when it comes due, not its eight workers
    for n in range(125):
        st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 3,
                                    clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 3)]))
    assert watched(st, T0 + 4.5, limits) == [] and watch.read == read
    # relay n7 falls silent: its workers come due with it, with no event to say so
    for n in range(125):
        if n != 7:
            st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 6,
                                        clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 6)]))
    got = watched(st, T0 + 6.5, limits)
    assert [src for src, _ in got] == [f"rollout/{i}" for i in range(56, 64)]
    assert watch.read - read == 2 * 8  # each of them read when its relay came due, and judged


def test_a_clock_at_the_end_of_time_is_never_silent_and_breaks_nothing():
    st = RunState()
    st.apply(ev.HeartbeatEvent(src="driver", ts=1.7976931348623157e308))
    assert watched(st, T0, Limits()) == walked(st, T0, Limits()) == []
