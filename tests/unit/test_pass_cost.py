"""A pass of the diagnosis costs what changed, not what exists: over a state where nothing changed, no rule reads a
worker, a memory scope or a GPU (each read counted); a worker whose deadline comes due is found without a change, and
so is a GPU."""

from __future__ import annotations

import pytest

from gkd_core import diagnosis
from gkd_core.diagnosis.gpu_index import GpuIndex
from gkd_core.diagnosis.marks import Marks
from gkd_core.diagnosis.memory_growth import GROWTH_WINDOW_S, GrowthIndex
from gkd_core.diagnosis.rules import RULES, Settings
from gkd_core.diagnosis.rules.gpu import GPU_IDLE_FULL_S
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

T0 = 1_000_000.0
NODES, PER_NODE = 32, 8


class CountedWorkers(dict):
    """``state.workers`` (or ``state.mem_scopes``, ``state.gpus``), counting every entry read through it (a walk reads
    them all)."""

    reads = 0

    def values(self):
        CountedWorkers.reads += len(self)
        return super().values()

    def items(self):
        CountedWorkers.reads += len(self)
        return super().items()

    def __iter__(self):
        CountedWorkers.reads += len(self)
        return super().__iter__()

    def get(self, key, default=None):
        CountedWorkers.reads += 1
        return super().get(key, default)

    def __getitem__(self, key):
        CountedWorkers.reads += 1
        return super().__getitem__(key)


def beats(st: RunState, ts: float, quiet_node: int | None = None) -> None:
    """Each node's relay says its workers alive at ``ts`` (a full beat from one of them: its node's memory)."""
    for n in range(NODES):
        if n == quiet_node:
            continue
        first = f"rollout/{n * PER_NODE}"
        mem = ev.MemoryBeat("node", 100 << 30, 1 << 40, 900 << 30, 0)
        st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=ts, beats=[ev.Beat(first, ts, "generate", 1.0, 1 << 30,
                                                                             50.0, 0, mem)],
                                    clocks=[ev.RelayClock(f"agent/n{n}", T0, ts)]))


def busy_run() -> RunState:
    """A healthy run of NODES x PER_NODE rollouts behind their nodes' relays, ten steps in: every worker has spans,
    the steps' metrics, its node's memory."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=10.0))
    for i in range(NODES * PER_NODE):
        n = i // PER_NODE
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"n{n}", pid=100 + i,
                                via=f"agent/n{n}", ts=T0))
    for n in range(NODES):
        members = tuple(f"rollout/{i}" for i in range(n * PER_NODE, (n + 1) * PER_NODE))
        st.apply(ev.HeartbeatsEvent(src=f"agent/n{n}", ts=T0 + 0.5, beats=[ev.Beat(m, T0 + 0.5) for m in members],
                                    clocks=[ev.RelayClock(f"agent/n{n}", T0, T0 + 0.5, members)]))
    for step in range(1, 11):
        t = T0 + step
        for i in range(NODES * PER_NODE):
            st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=step, ts=t))
            st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="idle", step=step, ts=t + 0.4 + 0.001 * (i % 7)))
        st.apply(ev.MetricsEvent(step=step, ts=t + 0.5, loss=1.0))
        beats(st, t + 0.6)
        gpus(st, t + 0.6)
    return st


def on_gpus(alerts: list[ev.AlertEvent], code: str = "gpu_") -> list[ev.AlertEvent]:
    """The alerts of the GPU rules (of ``code``)."""
    return [a for a in alerts if a.code.startswith(code)]


def gpus(st: RunState, ts: float, idle: tuple[int, ...] = (), nodes: range = range(NODES)) -> None:
    """Each node's GPUs read at ``ts``, one ``gpus`` batch a node: busy, but those of ``idle`` (indexes in the run)
    full of memory at 0 %."""
    for n in nodes:
        st.apply(ev.GpusEvent(src=f"agent/n{n}", node=f"n{n}", ts=ts, readings=[
            ev.GpuReading(index=i, util=0.0 if n * PER_NODE + i in idle else 95.0 + i % 3,
                          mem_used=(78 if n * PER_NODE + i in idle else 60) << 30, mem_total=80 << 30)
            for i in range(PER_NODE)]))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.__name__)
def test_a_pass_over_a_state_where_nothing_changed_reads_no_worker(rule):
    st = busy_run()
    now, cfg = T0 + 10.7, Settings()
    assert diagnosis.diagnose(st, now, cfg) == []  # healthy: the pass that makes the indexes
    st.workers, st.mem_scopes, st.gpus = (CountedWorkers(st.workers), CountedWorkers(st.mem_scopes),
                                          CountedWorkers(st.gpus))
    CountedWorkers.reads = 0
    assert rule(st, now + 0.1, cfg) == []
    assert CountedWorkers.reads == 0, f"{rule.__name__} read {CountedWorkers.reads} workers, scopes or GPUs"


def test_a_whole_pass_over_a_state_where_nothing_changed_reads_no_worker():
    st = busy_run()
    now, cfg = T0 + 10.7, Settings()
    assert diagnosis.diagnose(st, now, cfg) == []
    st.workers, st.mem_scopes, st.gpus = (CountedWorkers(st.workers), CountedWorkers(st.mem_scopes),
                                          CountedWorkers(st.gpus))
    CountedWorkers.reads = 0
    assert diagnosis.diagnose(st, now + 0.1, cfg) == []
    assert CountedWorkers.reads == 0


def test_a_worker_whose_deadline_comes_due_is_found_without_a_change():
    """A straggler: a worker stays in its step while its peers finish, and nothing more is said of it; it is found
    as time passes, reading the few it names."""
    st = busy_run()
    cfg = Settings()
    assert diagnosis.diagnose(st, T0 + 10.7, cfg) == []
    for i in range(NODES * PER_NODE):
        st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=11, ts=T0 + 16.1))
        if i != 77:
            st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="idle", step=11, ts=T0 + 16.5))
    beats(st, T0 + 16.6)
    assert diagnosis.diagnose(st, T0 + 16.7, cfg) == []
    for t in (17.6, 18.6, 19.6, 20.6, 21.6, 22.6):
        beats(st, T0 + t)  # (the relays' word: no change the indexes are fed)
    st.workers = CountedWorkers(st.workers)
    CountedWorkers.reads = 0
    late = [a for a in diagnosis.diagnose(st, T0 + 22.8, cfg) if a.code == "straggler"]
    assert [a.targets for a in late] == [["rollout/77"]]
    assert CountedWorkers.reads <= 10  # (the one named, read by the rules that say it)


def test_between_passes_each_index_takes_in_a_slice_of_a_burst_and_the_pass_finds_little_left(monkeypatch):
    """131,072 first beats, or a step's phases, come between two passes: the supervisor's ticks take them in a slice
    at a time (``diagnosis.keep_up``), and the pass after them reads none of them again."""
    monkeypatch.setattr(diagnosis, "KEEP_UP_MOST", 64)
    st = busy_run()
    now, cfg = T0 + 10.7, Settings()
    assert diagnosis.diagnose(st, now, cfg) == []
    for i in range(NODES * PER_NODE):  # a step's phases, and a change of Ray's word for each
        st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=11, ts=now))
        st.apply(ev.RayEvent(target=f"rollout/{i}", state="ALIVE", ts=now))
    marks = st.kept_if("marks")
    assert isinstance(marks, Marks)
    read = marks.read
    diagnosis.keep_up(st, budget_s=0.0)
    assert marks.read - read == 64  # a slice
    diagnosis.keep_up(st, budget_s=60.0)  # slices until nothing is left (a tick's budget: the rest at the next)
    assert st.backlog() == 0
    read = marks.read
    assert diagnosis.diagnose(st, now + 0.1, cfg) == []
    assert marks.read == read  # all of it taken in before the pass



def test_a_worker_whose_heartbeats_stop_is_found_without_a_change():
    """The stale heartbeat's: node 5's relay and its workers fall silent, and nothing is said of them; as time passes
    they are found, reading the few that fell silent (the beat table), not every worker."""
    st = busy_run()
    cfg = Settings()
    assert diagnosis.diagnose(st, T0 + 10.7, cfg) == []
    for t in (11.6, 12.6, 13.6, 14.6, 15.6, 16.6, 17.6, 18.6, 19.6, 20.6):
        beats(st, T0 + t, quiet_node=5)
    st.workers = CountedWorkers(st.workers)
    CountedWorkers.reads = 0
    stale = [a for a in diagnosis.diagnose(st, T0 + 20.7, cfg) if a.code == "heartbeat_stale"]
    assert sorted(t for a in stale for t in a.targets) == sorted(f"rollout/{i}" for i in range(5 * PER_NODE,
                                                                                              6 * PER_NODE))
    assert CountedWorkers.reads <= 8 * PER_NODE  # (those named, each read by the few rules that say it)


def test_the_nodes_memory_is_looked_at_once_a_window_not_at_every_reading():
    """Every node's relay says its node's memory each second (16,384 readings a second at the largest): none of them
    waits for an index between passes (a healthy node's is no low one's), and the growth index looks at each node's
    once its window can end, not at each reading."""
    st = busy_run()
    now, cfg = T0 + 10.7, Settings()
    assert diagnosis.diagnose(st, now, cfg) == []
    growth = st.kept_if("growth")
    assert isinstance(growth, GrowthIndex)
    looked, seconds = growth.looked, 12
    for s in range(1, seconds + 1):
        beats(st, now + s)
        assert st.backlog() == 0  # nothing fed: no scope made, none low
        diagnosis.keep_up(st)
        assert diagnosis.diagnose(st, now + s + 0.1, cfg) == []
    windows = growth.looked - looked
    assert seconds // (GROWTH_WINDOW_S + 1) * NODES <= windows <= (seconds // GROWTH_WINDOW_S + 1) * NODES, windows


def test_a_node_gone_quiet_is_looked_at_less_and_less_often():
    """A scope whose reading does not come is looked at again as long after as it has been quiet: 16,384 nodes gone
    quiet together (a run's end, a partition) are not looked at every second."""
    st = busy_run()
    now, cfg = T0 + 10.7, Settings()
    assert diagnosis.diagnose(st, now, cfg) == []
    growth = st.kept_if("growth")
    assert isinstance(growth, GrowthIndex)
    looks: dict[str, set[float]] = {"n5|node": set(), "n4|node": set()}  # (each look sets the next one's time)
    for s in range(1, 31):
        beats(st, now + s, quiet_node=5)
        diagnosis.keep_up(st)
        diagnosis.diagnose(st, now + s + 0.1, cfg)
        for key, times in looks.items():
            times.add(growth.scopes[key].look_at)
    assert len(looks["n4|node"]) >= 30 // (GROWTH_WINDOW_S + 1)  # heard from: a look a window
    assert len(looks["n5|node"]) <= 5  # quiet since the first second: at 4, 8, 16 and 32 s, not each second


def test_a_gpu_full_and_idle_for_a_minute_is_found_without_a_change_reading_only_it():
    """A GPU whose memory is full at 0 % for GPU_IDLE_FULL_S is named once its minute is up, with no reading since
    (its node's relay sends nothing new); the pass reads that GPU, not the run's."""
    st = busy_run()
    cfg = Settings()
    gpus(st, T0 + 11, idle=(77,))  # rollout/77's GPU: n9's 5th
    t = T0 + 11
    while t < T0 + 11 + GPU_IDLE_FULL_S - 10:
        t += 10
        beats(st, t)
        gpus(st, t, idle=(77,))  # (each node's reading in full every 10 s)
        assert on_gpus(diagnosis.diagnose(st, t + 0.1, cfg), "gpu_idle_full") == []
    beats(st, t + 5)
    st.gpus = CountedWorkers(st.gpus)
    CountedWorkers.reads = 0
    (idle,) = on_gpus(diagnosis.diagnose(st, T0 + 11 + GPU_IDLE_FULL_S + 0.1, cfg), "gpu_idle_full")
    assert (idle.code, idle.targets[0]) == ("gpu_idle_full", "gpu n9/5"), idle
    # the one named; and at the spread's look its node's GPUs, where it is far below the busiest too
    assert CountedWorkers.reads <= 1 + PER_NODE


def test_the_gpus_spread_is_looked_at_once_a_window_reading_only_the_nodes_read_since():
    """Every node's GPUs are read; the spread between the busiest and the idlest (``gpu_unbalanced``) is taken
    again per node as its readings come (reading that node's GPUs), looked at over the nodes every LOOK_S, and found
    on a node gone idle."""
    st = busy_run()
    cfg = Settings()
    beats(st, T0 + 69)
    gpus(st, T0 + 69)
    assert on_gpus(diagnosis.diagnose(st, T0 + 70, cfg)) == []  # (a minute in: the spread is judged)
    index = st.kept_if("gpu_index")
    assert isinstance(index, GpuIndex)
    read = index.read
    for s in range(1, 7):  # one node's GPUs read each second: the rest say nothing new
        beats(st, T0 + 70 + s)
        gpus(st, T0 + 70 + s, nodes=range(3, 4))
        diagnosis.diagnose(st, T0 + 70 + s + 0.1, cfg)
    assert index.read - read <= 6 * 2 * PER_NODE  # each second's readings taken in, and their node's spread
    for s in range(10, 90, 5):  # node 4's GPUs idle for over a minute, the rest busy
        beats(st, T0 + 70 + s)
        gpus(st, T0 + 70 + s, idle=tuple(range(4 * PER_NODE, 5 * PER_NODE)), nodes=range(4, 5))
        gpus(st, T0 + 70 + s, nodes=[n for n in range(NODES) if n != 4])
        named = {a.code: a for a in on_gpus(diagnosis.diagnose(st, T0 + 70 + s + 0.1, cfg))}
    unbalanced = named["gpu_unbalanced"]
    assert unbalanced.targets == [f"gpu n4/{i}" for i in range(PER_NODE)], unbalanced.targets
    assert f"{PER_NODE} of {NODES * PER_NODE} far below the busiest" in unbalanced.message
