"""Memory in the state and the diagnosis: each scope's growth learned from its own heartbeats, a scope
growing toward its limit named by its grower before the kill (not a big flat one, not a start-up's climb),
and a death by the OOM killer found from the scope's count and given to the largest of the dead."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.supervisor.oom_watch import OomWatch
from gkd_core.telemetry import events as ev

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
    assert a.message == "Grower/0 was killed by the OOM killer (cgroup job_42: its kills 0 -> 1) at 2.2 GB of 3.0 GB, in grow"


def test_no_kill_in_the_scope_no_oom_killed():
    st = job("Gone/0")
    beat(st, "Gone/0", T0, GB, 2 * GB)
    said: list[ev.Event] = []
    watch = OomWatch(said.append, heartbeat_s=1.0, read={f"{CG}/memory.events": "oom 0\noom_kill 0\n"}.get)
    watch.node = "n0"
    watch.check(st, T0 + 10)
    assert said == []
