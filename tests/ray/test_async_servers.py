"""A pool of async servers under `gkd-tui launch --` (tests/jobs/ray_async_servers.py: four async actors,
eight concurrent calls each a round), one of which stops answering: that server alone is named, within
10 s of the straggler floor, with its calls in flight and the oldest's age on screen and the `await` its
stuck coroutine waits at in its stack; its healthy rounds raised nothing first."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir
from gkd_core.diagnosis.stragglers import MIN_S

JOB = Path(__file__).resolve().parents[1] / "jobs" / "ray_async_servers.py"
HEALTHY_S = 15  # the pool's healthy rounds before one server stalls
NAMED_WITHIN_S = MIN_S + 10


@pytest.mark.timeout(HEALTHY_S + 200)
def test_an_async_server_whose_requests_stop_returning_is_named_alone_with_its_calls_in_flight(gkd_home):
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), str(HEALTHY_S))
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def stalled_at() -> float | None:
            log = run / "logs" / "driver.log"
            found = re.search(r"STALLED AT ([\d.]+)", log.read_text() if log.exists() else "")
            return float(found[1]) if found else None

        began = wait_until(stalled_at, HEALTHY_S + 120, "the pool's healthy rounds to end", every_s=1.0)

        def alarms() -> list[dict]:
            return [e for e in logged_events(run) if e["kind"] == "alert" and not e.get("cleared")
                    and e.get("severity") in ("warn", "critical")]

        named = wait_until(lambda: [a for a in alarms() if a["ts"] >= began and "Server/2" in a["targets"]],
                           NAMED_WITHIN_S + 30, "the stalled server named", every_s=0.5)
        assert named[0]["ts"] - began <= NAMED_WITHIN_S, (named[0]["ts"] - began, named[0]["message"])
        assert re.match(r"Server/2 still in generate \(the oldest of 8 in flight\) after ", named[0]["message"]), \
            named[0]["message"]
        time.sleep(2.0)  # and nobody else, then or a moment later: not its peers, not the driver waiting on it
        assert [(a["code"], a["message"]) for a in alarms() if a["ts"] < began] == []  # the healthy rounds
        others = [(a["code"], a["message"]) for a in alarms() if set(a["targets"]) - {"Server/2"}]
        assert others == [], others

        status = gkd_tui("status", str(run))
        row = next(line for line in status.stdout.splitlines() if line.startswith("Server/2 "))
        assert "8 generate in flight" in row, status.stdout
        # and the header says what holds the job: the driver's wait ends in a request inside that server
        assert "held by  an inference request in a server: Server/2, 8 generate in flight" in status.stdout, \
            status.stdout
        age = float(re.search(r"in flight\s+(\d+(?:\.\d+)?)s", row)[1])  # the oldest's, since the stall
        assert age >= MIN_S, row

        dump = gkd_tui("dump-stacks", "--run", str(run), "--json", "Server/2", timeout=60)
        assert dump.returncode == 0, dump.stderr
        stack = json.loads(dump.stdout)["groups"][0]
        line = next(i for i, text in enumerate(JOB.read_text().splitlines(), 1) if "never returns" in text)
        assert f"ray_async_servers.py:{line}" in stack["stack"] and "`generate`" in stack["where"], stack
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)
