"""supervisor/unattended on a real loopback: /metrics scraped over HTTP while the loop answers it (and said
answered by no one when the loop does not), bound to 127.0.0.1; the notifier's outcomes on the record."""

from __future__ import annotations

import socket
import tarfile
import threading
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gkd_core.state import RunState
from gkd_core.supervisor import metrics
from gkd_core.supervisor.unattended import Unattended
from gkd_core.supervisor.unattended_settings import UnattendedConfig
from gkd_core.telemetry import events as ev


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_scrape_is_answered_by_the_loop_from_its_state_on_the_loopback_only(monkeypatch):
    st = RunState()
    st.apply(ev.RunEvent(src="supervisor", state="running", ts=100.0, run="r1"))
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", rank=0, ts=100.0))
    st.apply(ev.PhaseEvent(src="rollout/0", phase="sync_weights", ts=101.0))
    u = Unattended(UnattendedConfig(metrics_port=free_port()), "r1", "gkd-tui attach r1")
    try:
        assert u.metrics_address.startswith("http://127.0.0.1:")
        assert u._server.server_address[0] == "127.0.0.1"
        stop = threading.Event()

        def loop():  # the supervisor's loop: its chores every tick
            while not stop.is_set():
                u.tick(st, 111.0, lambda e: None)
                time.sleep(0.01)

        looping = threading.Thread(target=loop)
        looping.start()
        with urllib.request.urlopen(u.metrics_address, timeout=10) as answer:
            text = answer.read().decode()
        stop.set()
        looping.join(5)
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples[("gkd_worker_phase_seconds", (("phase", "sync_weights"), ("role", "rollout"),
                                                     ("worker", "rollout/0")))] == 10.0
        # a loop that does not answer: the scrape says so within its deadline, and does not hang
        monkeypatch.setattr(metrics, "ASK_DEADLINE_S", 0.2)
        with urllib.request.urlopen(u.metrics_address, timeout=10) as answer:
            assert "gkd_supervisor_answered 0.0" in answer.read().decode()
    finally:
        u.close()


def test_the_notifiers_outcomes_go_on_the_record_as_actions():
    recorded: list[ev.Event] = []
    u = Unattended(UnattendedConfig(notify_commands=["cat > /dev/null", "exit 4"]), "r1", "gkd-tui attach r1")
    try:
        u.notifier.backoff_s = 0.01
        u.alert(ev.AlertEvent(severity="critical", code="straggler", targets=["rollout/1"], message="late", ts=1.0))
        deadline = time.monotonic() + 10
        while len(recorded) < 2 and time.monotonic() < deadline:
            u.tick(RunState(), 2.0, recorded.append)
            time.sleep(0.02)
    finally:
        u.close()
    assert [(e.op, e.ok, e.result.to, e.result.alert, e.result.tries) for e in recorded] == [
        ("notify", True, "command", "straggler", 1), ("notify", False, "command", "straggler", 3)]
    assert recorded[1].result.error.startswith("ValueError: exit 4")


def test_a_metrics_port_in_use_is_said_on_the_record_and_the_rest_goes_on():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        recorded: list[ev.Event] = []
        u = Unattended(UnattendedConfig(metrics_port=port), "r1", "gkd-tui attach r1")
        try:
            u.tick(RunState(), 1.0, recorded.append)
            u.tick(RunState(), 2.0, recorded.append)
        finally:
            u.close()
    assert u.metrics_address == "" and len(recorded) == 1
    assert recorded[0].level == "warn" and recorded[0].message.startswith(f"/metrics not served: 127.0.0.1:{port}: ")
    assert "another --metrics-port" in recorded[0].message


def test_a_command_that_fails_at_once_is_restarted_by_the_policy_though_its_run_ended_then_left_failed(
        gkd_home, webhook):
    """A failed run's supervisor stays for the restart the policy has yet to make (whatever --linger says), takes
    the report, runs the command again; the budget spent, the run is left as it ended, said and told."""
    import sys

    from conftest import gkd_tui, logged_events, wait_until

    from gkd_core import rundir

    url, posted = webhook
    got = gkd_tui("launch", "--detach", "--linger", "0", "--restart-on", "driver_failed", "--restart-grace", "1",
                  "--restart-budget", "1", "--notify", url, "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    wait_until(lambda: not (run / "endpoints.json").exists() or rundir.read_endpoints(run) is None or [
        e for e in logged_events(run) if e["kind"] == "alert" and e["code"] == "restart_budget_spent"], 90,
               "the budget spent", every_s=0.5)
    events = logged_events(run)
    ends = [(e["state"], e.get("exit_code")) for e in events if e["kind"] == "run" and e["state"] != "starting"]
    assert ends == [("running", None), ("failed", 3), ("restarting", None), ("running", None), ("failed", 3)], ends
    stages = [e["result"]["stage"] for e in events if e["kind"] == "action" and e["op"] == "recover"]
    assert [s for s in stages if s != "report_written"] == ["report", "restart"]  # (its archive: written beside)
    wait_until(lambda: (run / "bundles" / "recovery-001.tar.gz").exists(), 30, "the report's archive")
    # a failed run's report has the supervisor's live state (not a replay of the whole event log, minutes for a
    # night's)
    with tarfile.open(run / "bundles" / "recovery-001.tar.gz") as tar:
        status = next(tar.extractfile(m).read().decode() for m in tar.getmembers() if m.name.endswith("/status.txt"))
    assert "no live state" not in status, status[:300]
    spent = [e for e in events if e["kind"] == "alert" and e["code"] == "restart_budget_spent"]
    assert len(spent) == 1 and spent[0]["severity"] == "critical"
    wait_until(lambda: {("restart", "driver_failed"), ("alert", "restart_budget_spent")} <= {
        (p.body["kind"], p.body["code"]) for p in posted}, 20, "the restart and the budget told")
