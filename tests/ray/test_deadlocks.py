"""A deadlock between the components of a plain Ray job under `gkd-tui launch --` (tests/jobs/ray_deadlock.py),
named as a cycle of waits with every member and edge, within the straggler threshold and 5 s; the job's
healthy rounds, whose actors call each other and return, raise nothing first."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir
from gkd_core.diagnosis.rules.waits import STILL_S

JOBS = Path(__file__).resolve().parents[1] / "jobs"
HEALTHY_S = 60  # the job's healthy rounds before it deadlocks
NAMED_WITHIN_S = STILL_S + 5


def line_of(text: str) -> int:
    job = (JOBS / "ray_deadlock.py").read_text().splitlines()
    return next(i for i, line in enumerate(job, 1) if text in line)


@pytest.mark.timeout(HEALTHY_S + 240)
def test_two_deadlocks_are_each_named_as_a_cycle_after_healthy_rounds_that_raised_nothing(gkd_home):
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOBS / "ray_deadlock.py"),
                  str(HEALTHY_S))
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def deadlocked_at() -> float | None:
            found = re.search(r"DEADLOCK AT ([\d.]+)", (run / "logs" / "driver.log").read_text()
                              if (run / "logs" / "driver.log").exists() else "")
            return float(found[1]) if found else None

        began = wait_until(deadlocked_at, HEALTHY_S + 120, "the job's healthy rounds to end", every_s=1.0)

        def both_named():
            cycles = {}
            for e in logged_events(run):
                if e["kind"] == "alert" and e["code"] == "deadlock" and not e.get("cleared"):
                    cycles.setdefault(tuple(sorted(e["targets"])), e)
            return cycles if len(cycles) == 2 else None

        cycles = wait_until(both_named, NAMED_WITHIN_S + 30, "both deadlocks named", every_s=0.5)
        alarms = [e for e in logged_events(run) if e["kind"] == "alert" and e["ts"] < began
                  and e.get("severity") in ("warn", "critical")]
        assert alarms == [], f"the healthy rounds raised: {[(a['code'], a['message']) for a in alarms]}"

        calls = cycles[("Inference/0", "Trainer/0")]
        assert calls["message"].startswith("deadlock: Trainer/0.step #"), calls["message"]
        assert "waits for Inference/0.generate #" in calls["message"]
        assert "which waits for Trainer/0.weights_ready, queued behind Trainer/0.step #" in calls["message"]
        collective = cycles[("Learner/0", "Rollout/0")]
        assert re.match(r"deadlock: Rollout/0\.pull #\d+ waits for Learner/0 to join broadcast #\d+ of group "
                        r"\S+ \(it is in push #\d+\), which waits for Rollout/0\.ready, queued behind "
                        r"Rollout/0\.pull #\d+", collective["message"]), collective["message"]
        for alert in (calls, collective):
            assert alert["severity"] == "critical" and "driver" in alert["evidence"]["blocked"]
            # named within the threshold and 5 s of the job's turn to deadlock (its cycle closes after it)
            assert alert["ts"] - began <= NAMED_WITHIN_S, (alert["ts"] - began, alert["message"])
        # nothing blames the driver, the victim at the end of both chains
        holding = [e for e in logged_events(run) if e["kind"] == "alert" and "driver" in e.get("targets", [])
                   and e.get("severity") in ("warn", "critical") and not e.get("cleared")]
        assert holding == [], [(a["code"], a["message"]) for a in holding]

        # the stacks, one key away: each member's shows the line it waits at
        for member, line in (("Trainer/0", "return ray.get(self.inference.generate"),
                             ("Inference/0", "ray.get(self.trainer.weights_ready"),
                             ("Learner/0", "ray.get(self.rollout.ready"),
                             ("Rollout/0", "dist.broadcast(t, src=0)")):
            got = gkd_tui("dump-stacks", "--run", str(run), "--json", member, timeout=60)
            dump = json.loads(got.stdout)
            assert got.returncode == 0, (member, got.stderr, dump.get("missing"))
            assert f"ray_deadlock.py:{line_of(line)}" in dump["groups"][0]["stack"], (member, dump["groups"][0])
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)
