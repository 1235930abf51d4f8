"""`gkd-tui dump-stacks` on a real run: it waits for the stacks, groups identical ones, and says what
it could not read (a SIGSTOPped worker) instead of waiting on it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT, wait_until

pytestmark = pytest.mark.slow


def test_grouped_stacks_within_10_s_and_a_note_for_the_stopped_worker(start_supervisor):
    sup = start_supervisor("trainer.total_steps=400", driver="gkd_core.trainer.driver")
    wait_until(lambda: len([e for e in sup.events() if e["kind"] == "metrics"]) >= 2, 240, "two training steps")
    workers = {e["src"]: e["pid"] for e in sup.events() if e["kind"] == "worker" and e.get("pid")}
    victim = workers["rollout/0"]
    os.kill(victim, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "dump-stacks", "--run", str(sup.run), "--json"],
                             capture_output=True, text=True, timeout=30, cwd=ROOT)
        took = time.monotonic() - t0
    finally:
        os.kill(victim, signal.SIGCONT)
    assert took < 10, f"dump-stacks took {took:.1f} s"
    report = json.loads(out.stdout)
    grouped = {t for g in report["groups"] for t in g["targets"]}
    assert {"driver", "student/0", "rollout/1", "teacher/proxy"} <= grouped, report
    # the stopped one: read without waiting for it (py-spy --nonblocking), and said so
    note = report["notes"].get("rollout/0") or report["missing"].get("rollout/0") or ""
    assert "stopped" in note.lower() or "sigstop" in note.lower(), report
    # the workers an alert names lead, then the odd ones out (the smallest groups)
    lead = [not set(g["targets"]) & set(report["named"]) for g in report["groups"]]
    assert lead == sorted(lead)
    sizes = [len(g["targets"]) for g, later in zip(report["groups"], lead, strict=True) if later]
    assert sizes == sorted(sizes)

    text = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "dump-stacks", "--run", str(sup.run)],
                          capture_output=True, text=True, timeout=30, cwd=ROOT)
    # rollout/0 goes on again: every worker answers (exit 1 would mean one did not), each in the report
    assert text.returncode == 0, text.stdout + text.stderr
    assert all(w in text.stdout
               for w in ("driver", "student/0", "rollout/0", "rollout/1", "teacher/proxy")), text.stdout
