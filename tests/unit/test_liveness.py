"""One judge of liveness (gkd_core/state/liveness.py): what it says of a silence, and that the stale heartbeat's
rule, the stuck-or-slow verdict and the dashboard's rows all follow it: a change of its threshold changes all
three."""

from __future__ import annotations

import pytest

from gkd_core import diagnosis
from gkd_core.diagnosis.rules.common import Settings
from gkd_core.diagnosis.verdict import verdict
from gkd_core.state import RunState, liveness
from gkd_core.state.liveness import ALIVE, DEAD, ENDED, FROZEN, LATE, Limits, judge
from gkd_core.telemetry import events as ev
from gkd_tui.widgets import worker_groups

T0 = 1_000_000.0
LIMITS = Limits(heartbeat_s=1.0, stall_s=10.0)


def run_with(silent_from: float, others_until: float) -> RunState:
    """Three rollouts beating once a second from T0; rollout/1 silent from ``silent_from``, the others until
    ``others_until``."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0, heartbeat_s=1.0, heartbeat_log_s=0.0))
    for i in range(3):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n", pid=10 + i, ts=T0))
        st.apply(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=1, started=T0, ts=T0))
    t = T0
    while t <= max(silent_from, others_until):
        for i in range(3):
            if t <= (silent_from if i == 1 else others_until):
                st.apply(ev.HeartbeatEvent(src=f"rollout/{i}", ts=t, cpu=90.0))
        t += 1.0
    return st


@pytest.mark.parametrize(("silent_s", "others", "word"), [
    (1.0, True, ALIVE), (4.0, True, LATE), (6.0, True, FROZEN),  # frozen at frozen_s while others beat
    (6.0, False, LATE), (9.0, False, LATE), (11.0, False, FROZEN),  # nobody heard: frozen only at stall_s
])
def test_a_silence_is_judged_by_its_length_and_whether_others_are_heard(silent_s, others, word):
    st = run_with(silent_from=T0 + 20, others_until=T0 + 20 + (silent_s if others else 0))
    got = judge(st, st.workers["rollout/1"], T0 + 20 + silent_s, LIMITS)
    assert got.word == word and got.silent_s == pytest.approx(silent_s)


def test_dead_and_ended_are_said_before_any_silence_and_a_worker_never_heard_is_not_silent():
    st = run_with(silent_from=T0 + 5, others_until=T0 + 40)
    st.workers["rollout/1"].ray_state = "DEAD"
    assert judge(st, st.workers["rollout/1"], T0 + 40, LIMITS).word == DEAD
    st.apply(ev.PhaseEvent(src="rollout/2", phase="finished", started=T0 + 40, ts=T0 + 40))
    assert judge(st, st.workers["rollout/2"], T0 + 60, LIMITS).word == ENDED
    st.apply(ev.WorkerEvent(src="rollout/3", role="rollout", rank=3, ts=T0 + 40))
    assert judge(st, st.workers["rollout/3"], T0 + 60, LIMITS) == (ALIVE, None)


def test_a_relays_clock_vouches_for_its_quiet_workers_and_the_rules_walk_asks_the_judge():
    """A relay's clock makes a worker whose own newest beat is old alive; the rule's walk, which asks the judge
    only of workers whose own beat is old, names exactly those the judge calls frozen."""
    st = run_with(silent_from=T0 + 20, others_until=T0 + 30)
    st.workers["rollout/0"].clock_via = "agent/n"
    st.apply(ev.HeartbeatsEvent(src="agent/n", ts=T0 + 30, clocks=[ev.RelayClock(relay="agent/n", epoch=1.0,
                                                                                    ts=T0 + 30)]))
    now = T0 + 31
    words = {src: judge(st, w, now, LIMITS).word for src, w in st.workers.items()}
    assert words == {"rollout/0": ALIVE, "rollout/1": FROZEN, "rollout/2": ALIVE}
    named = [a.targets for a in diagnosis.diagnose(st, now, Settings(stall_s=10.0)) if a.code == "heartbeat_stale"]
    assert named == [["rollout/1"]]


def three_say(st: RunState, now: float) -> tuple[bool, str, str | None]:
    """(the rule names rollout/1, the verdict's word for it, the dashboard row's word for it)"""
    w = st.workers["rollout/1"]
    named = any(a.code == "heartbeat_stale" and a.targets == ["rollout/1"]
                for a in diagnosis.diagnose(st, now, Settings(stall_s=10.0)))
    why = worker_groups.trouble(st, w, None, now, Limits(st.heartbeat_s, 10.0))
    return named, verdict(st, w, now, LIMITS).word, why[1] if why else None


def test_a_change_of_the_judges_threshold_changes_the_rule_the_verdict_and_the_dashboard(monkeypatch):
    st = run_with(silent_from=T0 + 20, others_until=T0 + 24)
    now = T0 + 24  # rollout/1 silent 4 s while its peers beat
    assert three_say(st, now) == (False, "silent", None)
    monkeypatch.setattr(liveness, "FROZEN_S", 3.5)
    monkeypatch.setattr(liveness, "FRESH_BEATS", 1)  # (else three beats hold frozen_s at 3 s at least)
    assert three_say(st, now) == (True, "frozen", "stale")
