"""supervisor/recovery.decide: a critical alert of a listed code restarts the run once it has held its grace
period, with a growing wait between restarts and at most the budget's number an hour; then "spent"."""

from __future__ import annotations

from gkd_core.state import RunState
from gkd_core.supervisor.recovery import RecoveryPolicy, decide
from gkd_core.telemetry import events as ev

T0 = 1_795_000_000.0
POLICY = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=60.0, per_hour=3, backoff_s=30.0)


def held(code: str = "straggler", severity: str = "critical", since: float = T0) -> RunState:
    st = RunState()
    st.apply(ev.AlertEvent(src="supervisor", severity=severity, code=code, targets=["rollout/1"],
                           message="rollout/1 is late", ts=since))
    return st


def test_off_unless_asked_and_only_a_listed_critical_alert_past_its_grace_restarts():
    assert decide(RecoveryPolicy(), held(), T0 + 600, []) is None  # no codes: off
    assert decide(POLICY, held(), T0 + 59, []) is None  # within its grace period
    assert decide(POLICY, held(code="teacher_not_serving"), T0 + 600, []) is None  # not a listed code
    assert decide(POLICY, held(severity="warn"), T0 + 600, []) is None  # not critical
    d = decide(POLICY, held(), T0 + 61, [])
    assert d is not None and (d.action, d.code, d.targets) == ("restart", "straggler", ["rollout/1"])
    assert d.reason == "straggler on rollout/1 held 61 s (the grace period is 60 s): restart 1 of 3 this hour"


def test_restarts_wait_longer_each_time_and_stop_at_the_budget():
    st = held(since=T0)
    assert decide(POLICY, st, T0 + 100, [T0 + 80]) is None  # 30 s after the first restart: not yet
    assert decide(POLICY, st, T0 + 111, [T0 + 80]).action == "restart"
    assert decide(POLICY, st, T0 + 150, [T0 + 80, T0 + 111]) is None  # 60 s after the second
    assert decide(POLICY, st, T0 + 172, [T0 + 80, T0 + 111]).action == "restart"
    spent = decide(POLICY, st, T0 + 400, [T0 + 80, T0 + 111, T0 + 172])
    assert spent.action == "spent" and spent.reason.startswith("3 restarts in the last hour (the budget is 3)")
    # an hour after the first, the budget has room again
    assert decide(POLICY, st, T0 + 80 + 3601, [T0 + 80, T0 + 111, T0 + 172]).action == "restart"
