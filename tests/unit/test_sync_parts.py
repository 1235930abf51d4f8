"""A weight sync in parts (``sync_part`` events): each part's usual time learned from the syncs before, the
slow part named with it, once, and not its victims; the state and the plots keep each sync's parts."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_tui import figures

T0 = 1000.0
MEMBERS = ("student/0", "rollout/0", "rollout/1")
PARTS = {"student/0": ("gather", "broadcast", "verify"), "rollout/0": ("broadcast", "load", "reset_cache", "verify"),
         "rollout/1": ("broadcast", "load", "reset_cache", "verify")}


def a_run() -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src in ("driver", *MEMBERS):
        role, _, rank = src.partition("/")
        st.apply(ev.WorkerEvent(src=src, role=role, rank=int(rank) if rank else None, ts=T0 - 50))
    return st


def sync(st: RunState, sync_id: int, t: float, slow: tuple[str, str, float] | None = None,
         until: float | None = None) -> float:
    """One sync from ``t``: each member's parts of 0.2 s; ``slow``: (member, part, seconds) takes that long,
    and the sync is left open at ``until`` when given (the slow part still under way then)."""
    st.apply(ev.SyncEvent(src="driver", sync_id=sync_id, state="started", pending=list(MEMBERS), timeout_s=600,
                          step=sync_id, ts=t))
    end = t
    for member in MEMBERS:
        at = t
        for part in PARTS[member]:
            took = slow[2] if slow and slow[:2] == (member, part) else 0.2
            st.apply(ev.SyncPartEvent(src=member, sync_id=sync_id, part=part, step=sync_id, started=at, ts=at))
            if until is not None and at + took > until:
                break
            st.apply(ev.SyncPartEvent(src=member, sync_id=sync_id, part=part, state="ended", step=sync_id,
                                      started=at, ts=at + took))
            at += took
        end = max(end, at)
    if until is None:
        st.apply(ev.SyncEvent(src="driver", sync_id=sync_id, state="done", elapsed_s=end - t, step=sync_id,
                              ts=end))
    return end


def test_the_slow_part_is_named_with_its_usual_time_and_nobody_else():
    st = a_run()
    t = T0
    for n in range(1, 6):
        t = sync(st, n, t) + 1.0
    assert diagnosis.diagnose(st, t) == []  # healthy syncs name nobody
    assert [round(s.parts_took["load"], 6) for s in st.sync_history] == [0.2] * 5
    assert round(st.series.syncs[-1].parts["load"], 6) == 0.2
    # rollout/1's load (after its 0.2 s broadcast) has taken 11.8 s
    sync(st, 6, t, slow=("rollout/1", "load", 60.0), until=t + 12)
    assert st.sync.parts_now == {"rollout/1": st.sync.parts_now["rollout/1"]}
    assert st.sync.parts_now["rollout/1"].part == "load"
    found = [a for a in diagnosis.diagnose(st, t + 7) if a.severity != "info"]
    assert [(a.code, a.targets) for a in found] == [("sync_part_slow", ["rollout/1"])], found
    assert found[0].message == "sync 6 (step 6): load into the engine 7 s on rollout/1, usually 0.20 s (the median " \
                               "of the last 5 syncs)", found[0].message
    assert found[0].severity == "warn" and found[0].evidence["part"] == "load"
    # fifty times its usual time is a part held, not a slow one: critical before four times its limit (20 s)
    assert [a.severity for a in diagnosis.diagnose(st, t + 10.1) if a.code == "sync_part_slow"] == ["warn"]
    assert [a.severity for a in diagnosis.diagnose(st, t + 10.3) if a.code == "sync_part_slow"] == ["critical"]
    assert [a.severity for a in diagnosis.diagnose(st, t + 30) if a.code == "sync_part_slow"] == ["critical"]


def test_a_part_usually_seconds_long_keeps_the_ladder_to_critical():
    """A part whose usual time is seconds (a vLLM engine's load) over its limit is slow, not held: warned, and
    critical only past four times its limit."""
    st = a_run()
    t = T0
    for n in range(1, 6):
        t = sync(st, n, t, slow=("rollout/1", "load", 2.0)) + 1.0
    sync(st, 6, t, slow=("rollout/1", "load", 600.0), until=t + 60)
    assert [a.severity for a in diagnosis.diagnose(st, t + 15) if a.code == "sync_part_slow"] == ["warn"]
    assert [a.severity for a in diagnosis.diagnose(st, t + 41) if a.code == "sync_part_slow"] == ["critical"]


def test_under_the_floor_or_with_too_few_syncs_nothing_is_said():
    st = a_run()
    t = sync(st, 1, T0) + 1.0
    sync(st, 2, t, slow=("rollout/1", "load", 60.0), until=t + 30)  # one sync before: its usual time unknown
    assert not [a for a in diagnosis.diagnose(st, t + 30) if a.code == "sync_part_slow"]
    st = a_run()
    t = T0
    for n in range(1, 5):
        t = sync(st, n, t) + 1.0
    sync(st, 5, t, slow=("rollout/1", "load", 60.0), until=t + 4.5)  # 4.3 s: over 5x its usual, under 5 s
    assert not [a for a in diagnosis.diagnose(st, t + 4.5) if a.code == "sync_part_slow"]


def test_a_broadcast_held_by_a_member_not_yet_in_it_names_that_member_not_the_broadcast():
    st = a_run()
    t = T0
    for n in range(1, 6):
        t = sync(st, n, t) + 1.0
    # the student's gather takes a minute: the rollouts wait in the broadcast for it (their own clock runs)
    st.apply(ev.SyncEvent(src="driver", sync_id=6, state="started", pending=list(MEMBERS), timeout_s=600, ts=t))
    st.apply(ev.SyncPartEvent(src="student/0", sync_id=6, part="gather", started=t, ts=t))
    for r in ("rollout/0", "rollout/1"):
        st.apply(ev.SyncPartEvent(src=r, sync_id=6, part="broadcast", started=t, ts=t))
    found = [a for a in diagnosis.diagnose(st, t + 20) if a.code == "sync_part_slow"]
    assert [a.targets for a in found] == [["student/0"]] and "gather the weights 20 s" in found[0].message


def test_a_root_that_never_began_its_sync_holds_the_broadcast_though_the_driver_no_longer_calls_it_pending():
    """The student hung before its first part: the rollouts wait in the broadcast for it, and the driver's progress
    names only them pending (it takes a pending root for blocked by the rest). The broadcast is not the slow part;
    the collectives' rule names the root that has not joined."""
    st = a_run()
    t = T0
    for n in range(1, 6):
        t = sync(st, n, t) + 1.0
    st.apply(ev.SyncEvent(src="driver", sync_id=6, state="started", pending=list(MEMBERS), timeout_s=600, ts=t))
    for r in ("rollout/0", "rollout/1"):
        st.apply(ev.SyncPartEvent(src=r, sync_id=6, part="broadcast", started=t, ts=t))
    for k in range(1, 8):
        st.apply(ev.SyncEvent(src="driver", sync_id=6, state="progress", pending=["rollout/0", "rollout/1"],
                              timeout_s=600, elapsed_s=k, ts=t + k))
    assert st.sync.members == list(MEMBERS)
    assert [a for a in diagnosis.diagnose(st, t + 7.5) if a.code == "sync_part_slow"] == []


def test_a_members_word_after_the_sync_ended_still_counts_and_the_plot_stacks_the_parts():
    st = a_run()
    t = T0
    st.apply(ev.SyncEvent(src="driver", sync_id=1, state="started", pending=list(MEMBERS), timeout_s=600, ts=t))
    st.apply(ev.SyncEvent(src="driver", sync_id=1, state="done", elapsed_s=0.5, ts=t + 0.5))
    st.apply(ev.SyncPartEvent(src="rollout/0", sync_id=1, part="load", state="ended", started=t + 0.1, ts=t + 0.4))
    assert abs(st.sync_history[-1].parts_took["load"] - 0.3) < 1e-9
    assert abs(st.series.syncs[-1].parts["load"] - 0.3) < 1e-9  # the plot's point has it
    sync(st, 2, t + 1)
    _, to_scale = figures.syncs(st.series.syncs)
    names = [line.label for line in to_scale.lines]
    assert names[:4] == ["read back the fingerprint", "reset the engine's cache", "load into the engine",
                         "broadcast"], names
    assert "parts stacked" in to_scale.title
