"""supervisor/recovery: a critical alert of a listed code restarts the run once it has held its grace period,
with a growing wait between restarts and at most the budget's number an hour; then "spent", said and stopped.
The whole of it on a real job: tests/ray/test_recovery.py."""

from __future__ import annotations

import pytest

from gkd_core.config import ConfigError, RecoveryConfig, load_config
from gkd_core.state import RunState
from gkd_core.supervisor.control_ops import Refused
from gkd_core.supervisor.recovery import Recovery, RecoveryPolicy, decide
from gkd_core.supervisor.unattended import unattended_part
from gkd_core.supervisor.unattended_settings import UnattendedConfig
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops

T0 = 1_795_000_000.0
POLICY = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=60.0, per_hour=3, backoff_s=30.0)


class Asked:
    """What the recovery asked of the supervisor: restarts (each one's why), the workers it stopped (each one's
    cancel), stops (each one's why)."""

    def __init__(self, refuse: str = ""):
        self.restart: list[str] = []
        self.cancel: list[ops.CancelArgs] = []
        self.stop: list[str] = []
        self.refuse = refuse  # an op refused (no driver to ask, say), or ""

    def act(self, args: ops.Args, why: str) -> None:
        if ops.OP_OF[type(args)] == self.refuse:
            raise Refused(f"'{self.refuse}' needs a running driver; the run is failed")
        if isinstance(args, ops.RestartArgs):
            self.restart.append(why)
        elif isinstance(args, ops.CancelArgs):
            self.cancel.append(args)


def held(code: str = "straggler", severity: str = "critical", since: float = T0) -> RunState:
    """A run whose driver started a second before ``since``, when the alert was raised."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=since - 1))
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
    quick = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=0.0, per_hour=3, backoff_s=30.0)
    st = held(since=T0 + 82)  # (raised again by the driver the restart started)
    assert decide(quick, st, T0 + 100, [T0 + 80]) is None  # 30 s after the first restart: not yet
    assert decide(quick, st, T0 + 111, [T0 + 80]).action == "restart"
    st = held(since=T0 + 113)
    assert decide(quick, st, T0 + 150, [T0 + 80, T0 + 111]) is None  # 60 s after the second
    assert decide(quick, st, T0 + 172, [T0 + 80, T0 + 111]).action == "restart"
    st = held(since=T0 + 174)
    spent = decide(quick, st, T0 + 400, [T0 + 80, T0 + 111, T0 + 172])
    assert spent.action == "spent" and spent.reason.startswith("3 restarts in the last hour (the budget is 3)")
    # an hour after the first, the budget has room again
    assert decide(quick, st, T0 + 80 + 3601, [T0 + 80, T0 + 111, T0 + 172]).action == "restart"


def test_after_a_restart_only_the_new_drivers_time_counts_even_for_an_alert_never_cleared():
    st = held(since=T0)
    st.apply(ev.RunEvent(state="running", ts=T0 - 10))
    assert decide(POLICY, st, T0 + 300, [T0 + 100]) is None  # the restart's driver has not started yet
    # it started, and failed again before the diagnosis looked: the old finding stands, held from its start
    st.apply(ev.RunEvent(state="running", ts=T0 + 120))
    assert decide(POLICY, st, T0 + 170, [T0 + 100]) is None
    d = decide(POLICY, st, T0 + 181, [T0 + 100])
    assert d.action == "restart" and d.held_s == 61


def test_the_budget_spent_is_a_critical_alert_and_the_run_stopped_with_why_never_a_restart(tmp_path):
    said: list[ev.Event] = []
    asked = Asked()
    policy = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=60.0, per_hour=1, backoff_s=30.0)
    recovery = Recovery(policy, tmp_path, act=asked.act, stop=asked.stop.append)
    recovery.made = [T0 + 10]  # one restart already this hour
    st = held(since=T0 + 20)
    recovery.tick(st, T0 + 100, said.append)
    alerts = [e for e in said if isinstance(e, ev.AlertEvent)]
    assert [(a.code, a.severity, a.targets) for a in alerts] == [("restart_budget_spent", "critical", ["rollout/1"])]
    assert alerts[0].message.startswith("the recovery restarted the run 1 time(s) and 1 restarts in the last hour")
    assert asked.restart == [] and len(asked.stop) == 1
    assert asked.stop[0].startswith("the recovery's budget is spent (1 restarts in the last hour")
    policy_said = [e.result_said for e in said if isinstance(e, ev.ActionEvent) and e.op == "recovery"]
    assert policy_said[-1] == ("restart on straggler once critical for 60 s, the bug report taken first; at most 1 "
                               "an hour; 1 made; its budget is spent: not restarted again")
    recovery.tick(st, T0 + 200, said.append)  # said once
    assert sum(isinstance(e, ev.AlertEvent) for e in said) == 1 and len(asked.stop) == 1


def test_the_run_configs_policy_holds_unless_the_command_line_gives_its_own(tmp_path):
    section = load_config(None, ["recovery.restart_on=[heartbeat_stale]", "recovery.grace_s=20"]).recovery
    part = unattended_part(None, section, tmp_path, act=print, stop=print)
    assert part is not None and part.recovery is not None
    assert (part.recovery.policy.codes, part.recovery.policy.grace_s) == (frozenset({"heartbeat_stale"}), 20.0)
    told = UnattendedConfig(restart_on=["deadlock"], restart_grace_s=5.0)
    assert unattended_part(told, section, tmp_path, print, print).recovery.policy.codes == frozenset({"deadlock"})
    assert unattended_part(None, RecoveryConfig(), tmp_path, print, print) is None  # off: nothing to do
    with pytest.raises(ConfigError, match=r"'recovery.restart_on'.*'deadlok' is not an alert's code \(did you mean"):
        load_config(None, ["recovery.restart_on=[deadlok]"])


def test_the_wait_starts_again_after_a_driver_that_ran_healthy_for_minutes():
    """Faults minutes apart are not a crash loop: the sixth restart of an hour waits backoff_s, not 32 times it,
    when its driver ran minutes before its alert (the ETTR bench's first run waited 498 s)."""
    policy = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=10.0, per_hour=60, backoff_s=30.0)
    made = [T0 + 300 * n for n in range(6)]  # a restart every five minutes, the last at T0 + 1500

    def driver_alerted_after(ran_s: float) -> RunState:
        st = RunState()
        st.apply(ev.RunEvent(state="running", ts=T0 + 1501))
        st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                               message="rollout/1 is late", ts=T0 + 1501 + ran_s))
        return st

    healthy = driver_alerted_after(240.0)  # four minutes: a new fault, not the loop going on
    assert decide(policy, healthy, T0 + 1741 + 11, made).action == "restart"  # its grace, then at once
    looping = driver_alerted_after(40.0)  # failed 40 s in: a loop, the wait doubled five times
    assert decide(policy, looping, T0 + 1541 + 11, made) is None
    assert decide(policy, looping, T0 + 1500 + 30 * 32 + 1, made).action == "restart"


class FakeReport:
    """``gkd-tui bundle`` as the recovery sees it, with no process behind it: running until told it ended."""

    def __init__(self, argv, **_):
        self.argv, self.returncode, self.pid = argv, None, -1

    def poll(self):
        return self.returncode


def test_the_restart_waits_for_the_reports_live_part_not_its_archive(tmp_path, monkeypatch):
    """Restarted once the report marks its live part taken (the stacks, Ray's view), while its archive is still
    being written; the archive's end said after (a night's event log takes a minute to compress)."""
    import gkd_core.supervisor.recovery as recovery_module

    reports: list[FakeReport] = []
    monkeypatch.setattr(recovery_module.subprocess, "Popen", lambda argv, **kw: reports.append(FakeReport(argv)) or
                        reports[-1])
    (tmp_path / "logs").mkdir()  # (a run directory's)
    said: list[ev.Event] = []
    asked = Asked()
    recovery = Recovery(POLICY, tmp_path, act=asked.act, stop=asked.stop.append)
    st = held(since=T0)
    recovery.tick(st, T0 + 61, said.append)  # held past its grace: the report is started
    [report] = reports
    live = tmp_path / report.argv[report.argv.index("--live-taken") + 1]
    recovery.tick(st, T0 + 62, said.append)
    assert asked.restart == []  # the live part not taken yet: no restart
    live.touch()
    recovery.tick(st, T0 + 63, said.append)
    assert len(asked.restart) == 1 and report.poll() is None  # restarted, the archive still being written
    assert not live.exists()
    (tmp_path / "bundles" / "recovery-001.tar.gz").write_bytes(b"")
    report.returncode = 0
    recovery.tick(st, T0 + 70, said.append)
    stages = [(e.result.stage, e.ok) for e in said if isinstance(e, ev.ActionEvent) and e.op == "recover"]
    assert stages == [("report", True), ("restart", True), ("report_written", True)], stages


def replaceable(since: float = T0, pid: int = 4242) -> RunState:
    """``held``, where the worker named says its driver starts it again in its place (the trainer's rollouts with
    trainer.replace_rollouts, its teacher)."""
    st = held(since=since)
    st.apply(ev.WorkerEvent(src="rollout/1", role="rollout", rank=1, pid=pid, replaceable=True, ts=since - 0.5))
    return st


def test_a_worker_its_driver_replaces_is_replaced_alone_and_the_run_restarted_only_if_that_did_not_cure_it():
    st = replaceable()
    assert decide(POLICY, held(), T0 + 61, [], []).action == "restart"  # a worker not replaceable: the run
    assert decide(POLICY, st, T0 + 61, []).action == "restart"  # a recovery that cannot replace: the run
    d = decide(POLICY, st, T0 + 61, [], [])
    assert (d.action, d.targets) == ("replace", ["rollout/1"])
    assert d.reason == ("straggler on rollout/1 held 61 s (the grace period is 60 s): replaced in place, 1 of 3 "
                        "recoveries this hour")
    replaced = [(T0 + 65, ["rollout/1"])]
    assert decide(POLICY, st, T0 + 65 + 59, [], replaced) is None  # the new one is starting: its time to be up
    d = decide(POLICY, st, T0 + 65 + 61, [], replaced)  # the same alert, held since before: no cure
    assert d.action == "restart"
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                           message="rollout/1 is late", cleared=True, ts=T0 + 80))
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                           message="rollout/1 is late", ts=T0 + 300))  # a new fault, minutes after
    assert decide(POLICY, st, T0 + 361, [], replaced).action == "replace"
    # a replacement counts in the budget as a restart does
    more = [*replaced, (T0 + 100, ["rollout/0"]), (T0 + 200, ["rollout/1"])]
    assert decide(POLICY, st, T0 + 361, [], more).action == "spent"
    # raised within a minute of the replacement (Ray's word of the old one's death, say): the new one's to clear
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                           message="rollout/1 is late", cleared=True, ts=T0 + 362))
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=["rollout/1"],
                           message="rollout/1 is late", ts=T0 + 363))
    quick = RecoveryPolicy(codes=frozenset({"straggler"}), grace_s=5.0, per_hour=3, backoff_s=30.0)
    assert decide(quick, st, T0 + 363 + 30, [], [(T0 + 362, ["rollout/1"])]) is None


def test_the_replacement_stops_only_the_process_the_alert_was_about_and_a_refusal_restarts_the_run(tmp_path,
                                                                                                  monkeypatch):
    import gkd_core.supervisor.recovery as recovery_module

    reports: list[FakeReport] = []
    monkeypatch.setattr(recovery_module.subprocess, "Popen", lambda argv, **kw: reports.append(FakeReport(argv)) or
                        reports[-1])
    (tmp_path / "logs").mkdir()
    said: list[ev.Event] = []
    asked = Asked()
    recovery = Recovery(POLICY, tmp_path, act=asked.act, stop=asked.stop.append)
    st = replaceable(pid=4242)
    recovery.tick(st, T0 + 61, said.append)
    st.apply(ev.WorkerEvent(src="rollout/1", role="rollout", rank=1, pid=5151, replaceable=True, ts=T0 + 62))
    reports[-1].returncode = 0  # (the report ended)
    recovery.tick(st, T0 + 63, said.append)
    # the process the decision was about, not the one that registered since (its driver may have replaced it)
    assert asked.cancel == [ops.CancelArgs(target="rollout/1", mode="force", pid=4242)] and asked.restart == []
    assert recovery.replaced == [(T0 + 63, ["rollout/1"])]
    stages = [(e.result.stage, e.ok) for e in said if isinstance(e, ev.ActionEvent) and e.op == "recover"]
    assert stages == [("report", True), ("replace", True)], stages

    asked = Asked(refuse="cancel")  # no driver to ask
    recovery = Recovery(POLICY, tmp_path, act=asked.act, stop=asked.stop.append)
    recovery.tick(replaceable(), T0 + 61, said.append)
    reports[-1].returncode = 0
    recovery.tick(replaceable(), T0 + 62, said.append)
    assert len(asked.restart) == 1 and recovery.made == [T0 + 62]
    refused = [e.result for e in said if isinstance(e, ev.ActionEvent) and e.op == "recover" and not e.ok]
    assert refused[-1].error.endswith("; the run is restarted instead")
