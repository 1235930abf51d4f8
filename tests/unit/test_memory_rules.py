"""Memory in the state and the diagnosis: each scope's growth learned from its own heartbeats, a scope
growing toward its limit named by its grower before the kill (not a big flat one, not a start-up's climb),
and a death by the OOM killer found from the scope's count and given to the largest of the dead."""

from __future__ import annotations

import random

import pytest

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.supervisor.oom_watch import OomWatch
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import HeartbeatBatcher

T0 = 1000.0
GB, MB = 1 << 30, 1 << 20
CG = "/sys/fs/cgroup/job_42"


def job(*workers: str) -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src in ("driver", *workers):
        role, _, rank = src.partition("/")
        st.apply(ev.WorkerEvent(src=src, role=role, rank=int(rank) if rank else None, node="n0", pid=100,
                                ts=T0 - 50))
    return st


def beat(st: RunState, src: str, t: float, rss: int, used: int, kills: int = 0) -> None:
    st.apply(ev.HeartbeatEvent(src=src, ts=t, phase="grow", rss=rss, cpu=50.0,
                               mem=ev.MemoryBeat(CG, used, 3 * GB, 8 * GB, kills)))


def alerts(st: RunState, now: float, code: str) -> list[ev.AlertEvent]:
    """A pass of the diagnosis (the supervisor makes one a second: the growth is learned pass by pass)."""
    return [a for a in diagnosis.diagnose(st, now) if a.code == code]


def test_a_grower_is_named_with_the_time_to_its_cgroups_limit_and_a_big_flat_neighbour_is_not():
    st = job("Grower/0", "Flat/0")
    for s in range(0, 31):
        t = T0 + s
        beat(st, "Grower/0", t, 200 * MB + 40 * MB * s, GB + 40 * MB * s)
        beat(st, "Flat/0", t, 2 * GB, GB + 40 * MB * s)  # big, and flat
        said = alerts(st, t, "memory_growing")
        if s <= 8:  # growth learned, but not yet for the sustained time: not yet said
            assert said == [], s
    [a] = said
    assert a.targets == ["Grower/0"] and a.severity == "warn", a
    # 1.0 GB + 30 x 40 MB = 2.17 GB used, 0.83 GB left at 40 MB/s: about 21 s
    assert a.message.startswith("Grower/0: 1.4 GB, +40.0 MB/s; its cgroup job_42 2.2 GB of 3.0 GB: the limit in "
                                "about 2"), a.message
    for s in range(31, 41):
        beat(st, "Grower/0", T0 + s, 200 * MB + 40 * MB * s, GB + 40 * MB * s)
        beat(st, "Flat/0", T0 + s, 2 * GB, GB + 40 * MB * s)
        [a] = alerts(st, T0 + s, "memory_growing")
    assert a.severity == "critical", a  # 2.6 of 3.0 GB


def test_a_worker_moved_into_a_cgroup_of_its_own_is_named_when_it_grows_there_not_half_a_minute_later():
    """The random trials' OOM cell missed its first student: moved into a cgroup of its own (as a job put into its
    container's), it grew 30 MB/s to the kill, and nothing was said, because who is in which scope was listed again
    only every 30 s. A scope that rises with nobody listed in it is listed again at once."""
    st = job("student/0", "rollout/0")
    own = "/sys/fs/cgroup/job_42/student"
    for s in range(0, 20):  # all in the job's cgroup, which rose a while (its members were listed then)
        used = 2 * GB + 20 * MB * min(max(s - 5, 0), 10)
        beat(st, "student/0", T0 + s, 500 * MB, used)
        beat(st, "rollout/0", T0 + s, 300 * MB + 20 * MB * min(max(s - 5, 0), 10), used)
        alerts(st, T0 + s, "memory_growing")
    for s in range(20, 36):  # moved into its own cgroup of 600 MB, and growing 30 MB/s there
        st.apply(ev.HeartbeatEvent(src="student/0", ts=T0 + s, phase="train", rss=500 * MB + 30 * MB * (s - 20),
                                   cpu=50.0, mem=ev.MemoryBeat(own, 30 * MB * (s - 20), 600 * MB, 8 * GB, 0)))
        beat(st, "rollout/0", T0 + s, 500 * MB, 2 * GB + 200 * MB)
        said = alerts(st, T0 + s, "memory_growing")
        if said:
            break
    assert [a.targets for a in said] == [["student/0"]] and s <= 32, s  # 9 s of growth, and a window to see it


def test_a_start_ups_climb_and_a_scope_far_from_its_limit_are_not_warned():
    st = job("Worker/0")
    for s in range(0, 30):  # 300 MB a second for 5 s, then flat: a start-up
        rss = 300 * MB * min(s, 5)
        beat(st, "Worker/0", T0 + s, rss, GB + rss)
        assert alerts(st, T0 + s, "memory_growing") == [], s
    st = job("Slow/0")
    for s in range(0, 60):  # 5 MB a second with 1.5 GB left: five minutes away
        beat(st, "Slow/0", T0 + s, 5 * MB * s, GB + 5 * MB * s)
        assert alerts(st, T0 + s, "memory_growing") == [], s


def test_a_node_filled_mostly_by_another_job_is_not_blamed_on_a_worker_starting_beside_it():
    """CI's verl tier runs beside the vLLM tier: the node rose by ~250 MB/s for a minute (a model loading in
    another job) while a trainer imported its libraries at 60 MB/s; naming the trainer was wrong. A rise that
    is mostly the job's own is still named (the first test)."""
    st = job("Trainer/0", "Trainer/1")
    node = 6 * GB
    for s in range(0, 40):
        t = T0 + s
        node += 250 * MB
        for src, rate in (("Trainer/0", 10 * MB), ("Trainer/1", 60 * MB)):
            st.apply(ev.HeartbeatEvent(src=src, ts=t, phase="step", rss=100 * MB + rate * s, cpu=50.0,
                                       mem=ev.MemoryBeat("node", node, 24 * GB, 24 * GB - node, 0)))
        assert alerts(st, t, "memory_growing") == [], s


def test_a_death_by_the_oom_killer_goes_to_the_largest_of_the_dead_and_is_named_after():
    st = job("Grower/0", "Flat/0")
    st.apply(ev.PhaseEvent(src="Grower/0", phase="grow", started=T0, ts=T0))
    for s in range(0, 5):
        beat(st, "Grower/0", T0 + s, 2 * GB + 40 * MB * s, 2800 * MB)
        beat(st, "Flat/0", T0 + s, 200 * MB, 2800 * MB)
        beat(st, "driver", T0 + s, 100 * MB, 2800 * MB)
    # the grower is killed after its last beat; the driver fails on it and the run ends: all three gone
    st.apply(ev.RunEvent(state="failed", ts=T0 + 6))
    said: list[ev.Event] = []
    files = {f"{CG}/memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"}
    watch = OomWatch(said.append, heartbeat_s=1.0, read=files.get)
    watch.node = "n0"
    watch.check(st, T0 + 10)
    assert [(e.worker, e.kills_before, e.kills_after) for e in said] == [("Grower/0", 0, 1)]
    watch.check(st, T0 + 11)  # said once
    assert len(said) == 1
    st.apply(said[0])
    [a] = alerts(st, T0 + 11, "oom_killed")
    assert a.targets == ["Grower/0"]
    assert a.message == ("Grower/0 was killed by the OOM killer (cgroup job_42: its kills 0 -> 1) "
                         "at 2.2 GB of 3.0 GB, in grow")


def test_a_kill_in_a_workers_cgroup_is_not_given_again_to_a_process_of_the_node_that_died_beside_it():
    """The random trials' OOM cell: the student, in a cgroup of its own, killed by the OOM killer; the driver (the
    node its scope) failed on it a moment later. The node's count holds the cgroup's kill: it is the student's, not
    a second one for the driver; and a driver that said its own failure, or exited with a code, was not killed.
    Its new self (the run started again) is no OOM-killed one."""
    st = job("student/0", "rollout/0")
    for s in range(0, 5):
        beat(st, "student/0", T0 + s, 600 * MB, 580 * MB)
        st.apply(ev.HeartbeatEvent(src="rollout/0", ts=T0 + s, phase="idle", rss=300 * MB,
                                   mem=ev.MemoryBeat("node", 4 * GB, 24 * GB, 20 * GB, 9)))
        st.apply(ev.HeartbeatEvent(src="driver", ts=T0 + s, phase="train", rss=500 * MB,
                                   mem=ev.MemoryBeat("node", 4 * GB, 24 * GB, 20 * GB, 9)))
    st.apply(ev.PhaseEvent(src="rollout/0", phase="exited", ts=T0 + 6))  # (ended with the run: gone, not killed)
    files = {f"{CG}/memory.oom_control": "oom_kill 1\n", "/proc/vmstat": "pgfault 7\noom_kill 10\nother 1\n"}
    said: list[ev.Event] = []
    watch = OomWatch(said.append, heartbeat_s=1.0, read=files.get)
    watch.node = "n0"
    watch.check(st, T0 + 10)
    assert [(e.worker, e.scope) for e in said] == [("student/0", CG)]

    st.apply(ev.PhaseEvent(src="driver", phase="failed", detail="student/0 died during train", ts=T0 + 11))
    said.clear()
    watch = OomWatch(said.append, heartbeat_s=1.0, read={**files, f"{CG}/memory.oom_control": None}.get)
    watch.node = "n0"  # (the cgroup gone before this look: the node's kill is unexplained, yet not the driver's)
    watch.check(st, T0 + 12)
    assert [e.worker for e in said] == ["rollout/0"]  # the largest of the others gone, as before

    st.apply(ev.OomKilledEvent(worker="student/0", scope=CG, kills_before=0, kills_after=1, ts=T0 + 12))
    assert st.workers["student/0"].oom_killed is not None
    st.apply(ev.WorkerEvent(src="student/0", role="student", rank=0, node="n0", pid=101, ts=T0 + 40))
    assert st.workers["student/0"].oom_killed is None


def test_a_worker_said_killed_that_beats_after_it_was_not_killed():
    """The random trials' teacher OOM cell (seed 46/15): the kernel killed the teacher in its cgroup while the proxy
    beside it, starved by the reclaim, had been silent for seconds, and the node's count went up before the teacher
    was missed: the kill was given to the proxy. A process that beats after its death was said was not killed: the
    finding goes with its next beat, and the run settles (it stayed critical for good before)."""
    st = job("Proxy/0")
    beat(st, "Proxy/0", T0, 200 * MB, 2 * GB)
    st.apply(ev.OomKilledEvent(worker="Proxy/0", scope="node", kills_before=9, kills_after=10, ts=T0 + 5))
    assert [a.targets for a in alerts(st, T0 + 5.5, "oom_killed")] == [["Proxy/0"]]
    beat(st, "Proxy/0", T0 + 4.5, 200 * MB, 2 * GB)  # (sent before the word of its death: no proof)
    assert st.workers["Proxy/0"].oom_killed is not None
    beat(st, "Proxy/0", T0 + 6, 200 * MB, 2 * GB)
    assert st.workers["Proxy/0"].oom_killed is None
    assert alerts(st, T0 + 6.5, "oom_killed") == []


def test_no_kill_in_the_scope_no_oom_killed():
    st = job("Gone/0")
    beat(st, "Gone/0", T0, GB, 2 * GB)
    said: list[ev.Event] = []
    watch = OomWatch(said.append, heartbeat_s=1.0, read={f"{CG}/memory.events": "oom 0\noom_kill 0\n"}.get)
    watch.node = "n0"
    watch.check(st, T0 + 10)
    assert said == []


def test_after_an_oom_kill_the_restart_plan_is_the_memory_ladder_saying_so():
    from gkd_core.config import load_config
    from gkd_core.diagnosis.plan import restart_plan
    from gkd_core.supervisor import alerts as sup_alerts

    st = job("rollout/0")
    beat(st, "rollout/0", T0, 2 * GB, 2800 * MB)
    st.apply(ev.OomKilledEvent(worker="rollout/0", scope=CG, kills_before=0, kills_after=1, ts=T0 + 5))
    for a in sup_alerts.diff(st, sup_alerts.evaluate(st, T0 + 6, 10.0)):
        st.apply(a)
    plan = restart_plan(st, load_config(None))
    assert [c.key for c in plan] == ["actor.micro_batch_size", "rollout.max_new_tokens"]
    assert all(c.because.startswith("killed by the OOM killer: rollout/0 (the memory ladder, rung") for c in plan)


def test_a_node_short_of_memory_names_its_largest_workers_and_a_roomy_one_is_not_warned():
    st = job("Big/0", "Small/0")

    def node_beat(src: str, t: float, rss: int, available: int) -> None:
        st.apply(ev.HeartbeatEvent(src=src, ts=t, phase="run", rss=rss, cpu=50.0,
                                   mem=ev.MemoryBeat("node", 64 * GB - available, 64 * GB, available, 0)))

    for src, rss in (("Big/0", 40 * GB), ("Small/0", 2 * GB), ("driver", GB)):
        node_beat(src, T0, rss, 20 * GB)
    assert alerts(st, T0 + 1, "node_memory_low") == []  # 31 % available
    for src, rss in (("Big/0", 55 * GB), ("Small/0", 2 * GB), ("driver", GB)):
        node_beat(src, T0 + 2, rss, 5 * GB)
    [a] = alerts(st, T0 + 3, "node_memory_low")
    assert a.severity == "warn" and a.targets == ["Big/0"]
    assert a.message == "node n0: 5.0 GB of 64.0 GB available (8%); the largest here: Big/0 55.0 GB, Small/0 2.0 GB, " \
                        "driver 1.0 GB"
    node_beat("Big/0", T0 + 4, 60 * GB, 2 * GB)
    [a] = alerts(st, T0 + 5, "node_memory_low")
    assert a.severity == "critical"


def test_each_phase_carries_its_peak_into_the_history_and_the_details_compare_them():
    from gkd_core.telemetry.reporter import Reporter
    from gkd_tui.screens.worker_details import WorkerDetails

    rep = Reporter("rollout/0", ingest="", start=False)  # its queue is read here, not sent
    try:
        rep.register("rollout", 0, node="n0")
        for rss, phase in ((100 * MB, "train"), (300 * MB, None), (200 * MB, "sync_weights"), (700 * MB, None),
                           (250 * MB, None), (None, "train"), (240 * MB, None)):
            if rss is not None:
                rep._heartbeat(50.0, rss)
            if phase is not None:
                rep.set_phase(phase, step=1)
        rep.set_phase("train", step=1, detail="the same phase: no new span, the peak goes on")
        rep._heartbeat(50.0, 260 * MB)
        rep.set_phase("idle")
        events = [wire.decode(f) for f in rep._queue]
    finally:
        rep._ctx.term()  # (never started: nothing to close but its context)
    st = RunState()
    for e in events:
        st.apply(e)
    spans = [(s.phase, s.peak_rss // MB) for s in st.workers["rollout/0"].spans]
    # init ends at the first beat; train sees 300 (its first beat was 100: the phase began at the beat before);
    # sync_weights 700; the second train 260, through a phase event that did not change the phase
    assert spans == [("init", 100), ("train", 300), ("sync_weights", 700), ("train", 260)]
    line = next(x for x in WorkerDetails.describe(st, "rollout/0", T0).splitlines() if x.startswith("memory by"))
    assert line == "memory by phase (peak): sync_weights 700M (7.0x init), train 300M (3.0x init), init 100M"


def test_a_kill_counted_seconds_after_the_worker_fell_silent_is_still_found():
    st = job("Grower/0")
    for s in range(3):
        beat(st, "Grower/0", T0 + s, 2 * GB + 300 * MB * s, 2900 * MB)
    said: list[ev.Event] = []
    files = {f"{CG}/memory.events": "oom 0\noom_kill 0\n"}
    watch = OomWatch(said.append, heartbeat_s=1.0, read=files.get)
    watch.node = "n0"
    for t in range(6, 12):  # silent, reclaiming at its limit: no kill counted yet
        watch.check(st, T0 + t)
    files[f"{CG}/memory.events"] = "oom 1\noom_kill 1\n"
    watch.check(st, T0 + 12)
    assert [(e.worker, e.kills_after) for e in said] == [("Grower/0", 1)]
    watch.check(st, T0 + 13)
    assert len(said) == 1


def test_the_gpu_memory_a_worker_holds_is_in_its_details():
    from gkd_tui.screens.worker_details import WorkerDetails

    st = job("rollout/0")  # pid 100 on n0
    st.apply(ev.GpuEvent(src="agent/n0", node="n0", index=1, mem_used=30 * GB, mem_total=80 * GB, pids=[100, 7],
                         proc_mem={"100": 24 * GB, "7": 6 * GB}, ts=T0))
    st.apply(ev.GpuEvent(src="agent/n9", node="n9", index=0, pids=[100], proc_mem={"100": GB}, ts=T0))  # not its node
    lines = WorkerDetails.describe(st, "rollout/0", T0).splitlines()
    assert "GPU memory it holds (NVML): GPU 1 24G" in lines, lines


def test_past_the_scopes_kept_the_quarter_heard_from_longest_ago_go(monkeypatch):
    """A cluster of more nodes than scopes kept: each new scope must not cost a walk over all of them (it did:
    one ``min`` per beat of every node past 4,096), and the newest stay."""
    from gkd_core.state import memory_cases

    monkeypatch.setattr(memory_cases, "SCOPES_KEEP", 8)
    st = RunState()
    for n in range(20):
        st.apply(ev.WorkerEvent(src=f"rollout/{n}", role="rollout", rank=n, node=f"node-{n}", ts=100.0 + n))
        st.apply(ev.HeartbeatsEvent(src=f"agent/node-{n}", ts=100.0 + n, beats=[
            ev.Beat(f"rollout/{n}", 100.0 + n, "generate", 0.0, 1 << 30, 90.0, 0,
                    ev.MemoryBeat("node", 10 << 30, 100 << 30, 90 << 30, 0))]))
    assert 6 <= len(st.mem_scopes) <= 8
    assert "node-19|node" in st.mem_scopes and "node-0|node" not in st.mem_scopes


def test_a_grower_whose_first_reading_comes_after_the_scope_began_to_rise_is_still_named():
    """Who is in which scope is listed once for every scope: a worker registered then, but whose first memory
    reading came after, is added when it comes (it is likely the one that grows)."""
    st = job("Early/0", "Late/0")
    for s in range(0, 31):
        t = T0 + s
        beat(st, "Early/0", t, 2 * GB, GB + 40 * MB * s)  # big and flat: the scope rises from the start
        if s >= 6:  # its first reading after the rise began and the scope's members were listed
            beat(st, "Late/0", t, 200 * MB + 40 * MB * s, GB + 40 * MB * s)
        said = alerts(st, t, "memory_growing")
    assert [a.targets for a in said] == [["Late/0"]], said


def test_a_clock_at_the_end_of_the_floats_is_looked_at_once_a_pass_not_forever():
    """A scope is looked at again a while after its look, by the heartbeats' clock: at a clock where a while more is
    the same float (a fuzzed 1e308), the look falls due at once, and must not be taken again in the same pass."""
    st = job("Worker/0")
    for t in (T0, 1e308, float("inf")):
        beat(st, "Worker/0", t, 100 * MB, GB)
        assert alerts(st, t, "memory_growing") == []


def _leak_named_at(relayed: bool, rate: int) -> tuple[int, int]:
    """A node of 8 workers, its memory breathing by a few MB for a minute, then rollout/3 leaking ``rate`` bytes a
    second toward the node's 64 GB: (the second the leak is named at, the full beats sent before it began)."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for i in range(8):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n0", pid=100 + i,
                                via="agent/n0", ts=T0 - 50))
    relay, rnd, full_before = HeartbeatBatcher("agent/n0", "n0"), random.Random(7), 0
    for s in range(0, 180):
        leak = max(0, s - 60) * rate
        used = 8 * GB + rnd.randrange(32 * MB) + leak
        mem = ev.MemoryBeat("node", used, 64 * GB, 64 * GB - used, 0)
        beats = [ev.Beat(f"rollout/{i}", T0 + s + i / 100, "generate", 1.0, GB + (leak if i == 3 else 0)
                         + rnd.randrange(2 * MB), 50.0, 0, mem) for i in range(8)]
        if relayed:
            for b in beats:
                relay.add(b)
            frames = relay.take(now=T0 + s + 0.5)
            e = None if frames is None else wire.decode(frames[1])
        else:
            e = ev.HeartbeatsEvent(src="agent/n0", ts=T0 + s + 0.5, beats=beats)
        if e is not None:
            full_before += len(e.beats) if s < 60 else 0
            st.apply(e)
        said = alerts(st, T0 + s + 0.5, "memory_growing")
        if said:
            assert [a.targets for a in said] == [["rollout/3"]], said
            return s, full_before
    raise AssertionError("the leak was never named")


@pytest.mark.parametrize("rate", [400 * MB, 1500 * MB])  # named once within 90 s of the limit; once sustained 9 s
def test_a_leak_is_named_as_soon_when_the_relay_sends_memory_only_past_its_deadband(rate: int):
    """The relay sends a scope's reading when it moved by a share of what is left of it (``relay.same_memory``):
    a node whose memory breathes sends its full beats once every 10 s, not one a second, and a leak toward its
    limit is named when it would be from every reading (its readings come every beat long before it is warned
    of: the deadband shrinks with what is left)."""
    every_s, every_full = _leak_named_at(False, rate)
    relayed_s, relayed_full = _leak_named_at(True, rate)
    assert relayed_s <= every_s + 1, (relayed_s, every_s)
    assert every_full == 480 and relayed_full <= 8 * 7, relayed_full  # 8 a second; the forced full beats only
