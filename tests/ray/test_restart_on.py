"""Recovery without a person (#56, DESIGN §14): a plain Ray job that deadlocks every time it starts
(tests/jobs/ray_deadlock.py with no healthy rounds), under `gkd-tui launch --restart-on deadlock --`: restarted
by the policy once the deadlock has held its grace period, the bug report (with every worker's stacks) taken
before each restart, exactly the budget's number of times; then stopped, with a critical alert that says the
budget is spent, and each restart and that alert told to the webhook."""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

import pytest
from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir
from gkd_core.runlog.reader import replay

JOBS = Path(__file__).resolve().parents[1] / "jobs"
GRACE_S = 3.0
BUDGET = 2


@pytest.mark.timeout(420)
def test_a_job_that_always_hangs_is_restarted_up_to_its_budget_with_a_report_first_then_stopped_and_said(
        gkd_home, webhook):
    url, posted = webhook
    got = gkd_tui("launch", "recovery.backoff_s=1", "--detach", "--linger", "0", "--restart-on", "deadlock",
                  "--restart-grace", str(GRACE_S), "--restart-budget", str(BUDGET), "--notify", url, "--",
                  sys.executable, str(JOBS / "ray_deadlock.py"), "0")
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        wait_until(lambda: [e for e in logged_events(run) if e["kind"] == "action" and e["op"] == "recover"
                            and e["result"]["stage"] == "restart"], 180, "the first restart", every_s=1.0)
        said = gkd_tui("status", str(run)).stdout  # the live run's status says the policy and where it stands
        assert f"recovery restart on deadlock once critical for {GRACE_S:g} s, the bug report taken first; at most " \
               f"{BUDGET} an hour; 1 made" in said, said
        ended = wait_until(lambda: [e for e in logged_events(run) if e["kind"] == "run" and e["state"] == "stopped"],
                           360, "the run stopped once the budget was spent", every_s=1.0)[0]
    finally:
        gkd_tui("stop", str(run))
    events = logged_events(run)
    recovers = [e for e in events if e["kind"] == "action" and e["op"] == "recover"]
    # (a report's archive is written beside the restart it came before: said when done, the run's end may be first)
    written = [e for e in recovers if e["result"]["stage"] == "report_written"]
    assert all(e["ok"] for e in written), written
    recovers = [e for e in recovers if e not in written]
    assert [(e["result"]["stage"], e["ok"]) for e in recovers] == [("report", True), ("restart", True)] * BUDGET, [
        e["result"] for e in recovers]

    # each restart after the deadlock of its attempt held the grace period, its report taken in between
    deadlocks = [e for e in events if e["kind"] == "alert" and e["code"] == "deadlock" and not e.get("cleared")]
    restarted_at = 0.0
    for n, (report, restart) in enumerate(zip(recovers[::2], recovers[1::2], strict=True), 1):
        first = min(e["ts"] for e in deadlocks if e["ts"] > restarted_at)
        assert report["ts"] - first >= GRACE_S, (n, report["ts"] - first)
        assert report["result"]["code"] == "deadlock"
        assert restart["result"]["report"] == f"bundles/recovery-{n:03d}.tar.gz", restart["result"]
        wait_until(lambda: (run / restart["result"]["report"]).exists(), 60, f"report {n}'s archive")  # noqa: B023
        with tarfile.open(run / restart["result"]["report"]) as tar:
            stacks = next(m for m in tar.getmembers() if m.name.endswith("/stacks.txt"))
            taken = tar.extractfile(stacks).read().decode()
        assert "ray_deadlock.py" in taken, taken[:2000]  # the hung actors' own frames, taken for the report
        asked = [e for e in events if e["kind"] == "run" and report["ts"] <= e["ts"] <= restart["ts"]]
        assert [e["state"] for e in asked] == ["restarting"], asked
        assert asked[0]["reason"].startswith("restart requested by the recovery policy: deadlock on "), asked[0]
        restarted_at = restart["ts"]

    # the third deadlock: not restarted; the budget said, critical, and the run stopped with why
    spent = [e for e in events if e["kind"] == "alert" and e["code"] == "restart_budget_spent"]
    assert len(spent) == 1 and spent[0]["severity"] == "critical", spent
    assert spent[0]["ts"] > restarted_at and f"restarted the run {BUDGET} time(s)" in spent[0]["message"]
    assert "the recovery's budget is spent" in ended["reason"], ended["reason"]
    assert ended["restart"] == BUDGET

    # told: each restart, and the budget spent (the deadlocks themselves too, as every critical alert)
    def told():
        kinds = [(p.body["kind"], p.body["code"]) for p in posted]
        return kinds if kinds.count(("restart", "deadlock")) == BUDGET and (
            "alert", "restart_budget_spent") in kinds else None

    kinds = wait_until(told, 20, "the restarts and the spent budget told to the webhook", every_s=0.5)
    assert kinds.count(("alert", "deadlock")) >= BUDGET + 1, kinds
    assert f"{BUDGET} made; its budget is spent" in replay(run / "events.jsonl").recovery
