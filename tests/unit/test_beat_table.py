"""The beat table (gkd_core/state/beat_table.py) names who has fallen silent as a walk over every worker does, reading
only the few whose silence may have begun."""

from __future__ import annotations

import random

import pytest

from gkd_core.diagnosis import keep_up
from gkd_core.state import RunState
from gkd_core.state.beat_table import BEAT_TABLE, BeatTable, silent_workers
from gkd_core.state.liveness import FROZEN, LATE, Limits, silent_among
from gkd_core.telemetry import events as ev

T0 = 1_000_000.0


def walked(st: RunState, now: float, limits: Limits, least: str = LATE) -> list[tuple[str, str]]:
    return [(w.src, j.word) for w, j in silent_among(st, st.workers.values(), now, limits, least)]


def tabled(st: RunState, now: float, limits: Limits, least: str = LATE) -> list[tuple[str, str]]:
    return [(w.src, j.word) for w, j in silent_workers(st, now, limits, least)]


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

    def add_workers(self, n: int) -> None:
        for i in range(len(self.workers), len(self.workers) + n):
            via = self.relays[i % len(self.relays)] if i % 2 else ""
            src = f"rollout/{i}"
            self.workers.append((src, via))
            self.beating[src] = True
            self.st.apply(ev.WorkerEvent(src=src, role="rollout", rank=i, node=f"n{i % len(self.relays)}",
                                         pid=100 + i, via=via, ts=self.now))

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


@pytest.mark.parametrize("seed", range(16))
def test_the_table_says_what_the_walk_says(seed):
    """Questions now and then, the table made at the start or halfway (from the state as it is then), with what came
    between the questions taken in a few at a time (``keep_up``) or not; and workers added as the run goes."""
    run = RandomRun(seed)
    limits = Limits(heartbeat_s=1.0, stall_s=10.0)
    made_at = 0 if seed % 4 < 2 else 150
    for i in range(300):
        run.step()
        if i == 100:
            run.add_workers(10)
        if i < made_at:
            continue
        if seed % 2 == 1 and run.st.kept_if(BEAT_TABLE) is not None:
            keep_up(run.st)
        for now in (run.now, run.now + run.rnd.random() * 4):  # a question later than the newest event too
            for least in (LATE, FROZEN):
                assert tabled(run.st, now, limits, least) == walked(run.st, now, limits, least)


def test_nothing_changed_reads_no_worker_and_a_silent_relay_brings_its_workers():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=10.0))
    for i in range(1000):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", node=f"n{i // 8}", via=f"agent/n{i // 8}", ts=T0))
    for n in range(125):
        members = tuple(f"rollout/{i}" for i in range(8 * n, 8 * n + 8))
        st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 1, beats=[ev.Beat(m, T0 + 1) for m in members],
                                    clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 1.2, members)]))
    limits = Limits()
    assert tabled(st, T0 + 1.5, limits) == []
    table = st.kept_if(BEAT_TABLE)
    assert isinstance(table, BeatTable)
    reads = []
    st.workers = ReadCounted(st.workers, reads)
    assert tabled(st, T0 + 2.0, limits) == [] and reads == []  # nothing changed, nothing came due: no worker read
    for n in range(125):  # the relays go on: each says its eight workers alive, in one clock
        st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 3, clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 3)]))
    assert tabled(st, T0 + 5.5, limits) == [] and reads == []
    for n in range(125):  # relay n7 falls silent: its workers come due with it, with no event to say so
        if n != 7:
            st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 6,
                                        clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 6)]))
    got = tabled(st, T0 + 6.5, limits)
    assert [src for src, _ in got] == [f"rollout/{i}" for i in range(56, 64)]
    assert sorted(reads) == sorted(src for src, _ in got)  # each of them read, and judged; no other


class ReadCounted(dict):
    """``state.workers``, saying which worker each read (by its key) was of; a walk would fail the test at once."""

    def __init__(self, workers: dict, reads: list[str]):
        super().__init__(workers)
        self.reads = reads

    def __getitem__(self, key):
        self.reads.append(key)
        return super().__getitem__(key)

    def values(self):
        raise AssertionError("a walk over every worker")

    __iter__ = items = values


def test_an_ended_worker_is_set_aside_and_comes_back_with_its_next_phase():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=10.0))
    for i in range(3):
        st.apply(ev.HeartbeatEvent(src=f"rollout/{i}", ts=T0))
    st.apply(ev.PhaseEvent(src="rollout/1", phase="exited", ts=T0 + 0.5))
    limits = Limits()
    assert [src for src, _ in tabled(st, T0 + 20, limits)] == ["rollout/0", "rollout/2"]
    table = st.kept_if(BEAT_TABLE)
    assert isinstance(table, BeatTable) and table.beat[1] == float("inf")
    st.apply(ev.PhaseEvent(src="rollout/1", phase="init", ts=T0 + 21))  # started again, and silent since
    assert tabled(st, T0 + 30, limits) == walked(st, T0 + 30, limits)
    assert [src for src, _ in tabled(st, T0 + 30, limits)] == ["rollout/0", "rollout/1", "rollout/2"]


def test_a_clock_at_the_end_of_time_is_never_silent_and_breaks_nothing():
    st = RunState()
    st.apply(ev.HeartbeatEvent(src="driver", ts=1.7976931348623157e308))
    assert tabled(st, T0, Limits()) == walked(st, T0, Limits()) == []
