"""HTTP in a watched job (tests/jobs/ray_http_pipeline.py under `gkd-tui launch --`): an inference server in a
Ray actor serves over aiohttp.web, a rollout actor calls it with `requests`, and the server's handler stops
returning. The server reads its request in flight, not "idle"; the rollout's phase says which request it
awaits and who listens there; its edge in the wait-for graph leads to the server, which is named, with the
rollout and the driver blocked by it; and the request's query string is nowhere on the record."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir
from gkd_core.diagnosis.rules.waits import wait_graph
from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.state import RunState
from gkd_core.telemetry import wire
from gkd_core.vocab import HttpWait

JOB = Path(__file__).resolve().parents[1] / "jobs" / "ray_http_pipeline.py"
HEALTHY_S = 12  # the job's healthy rounds before its server stalls
NAMED_WITHIN_S = 15  # #55: the cause named within 15 s of the stall


@pytest.mark.timeout(HEALTHY_S + 200)
def test_a_server_whose_http_requests_stop_returning_is_the_wait_that_holds_the_rollout(gkd_home):
    server_stalls("aiohttp")


@pytest.mark.timeout(HEALTHY_S + 200)
def test_the_same_with_fastapi_under_uvicorn_and_httpx_as_vllm_serves_and_its_clients_send(gkd_home):
    server_stalls("fastapi")


def server_stalls(stack: str) -> None:
    """The job's inference server stalls: named alone, within 15 s, with its request in flight; the rollout and
    the driver its blocked; the rollout's edge to it; no query string on the record."""
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), str(HEALTHY_S), "server",
                  stack)
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def stalled_at() -> float | None:
            log = run / "logs" / "driver.log"
            found = re.search(r"STALLED AT ([\d.]+)", log.read_text() if log.exists() else "")
            return float(found[1]) if found else None

        began = wait_until(stalled_at, HEALTHY_S + 120, "the job's healthy rounds to end", every_s=1.0)

        def workers() -> dict[str, dict]:
            return {e["src"]: e for e in logged_events(run) if e["kind"] == "worker"}

        server = next(src for src in wait_until(workers, 30, "the job's workers") if src.startswith("InferenceServer"))
        pid = workers()[server]["pid"]

        def alarms() -> list[dict]:
            return [e for e in logged_events(run) if e["kind"] == "alert" and not e.get("cleared")
                    and e.get("severity") in ("warn", "critical")]

        named = wait_until(lambda: [a for a in alarms() if a["ts"] >= began and server in a["targets"]],
                           NAMED_WITHIN_S + 30, "the stalled server named", every_s=0.5)
        assert named[0]["ts"] - began <= NAMED_WITHIN_S, (named[0]["ts"] - began, named[0]["message"])
        rollouter = next(src for src in workers() if src.startswith("Rollouter"))
        assert set(named[0]["evidence"].get("blocked") or []) >= {rollouter}, named[0]
        assert [(a["code"], a["message"]) for a in alarms() if a["ts"] < began] == []  # the healthy rounds
        # nobody else is named: not the rollout awaiting the request, not the driver awaiting the rollout
        assert [(a["code"], a["targets"]) for a in alarms() if set(a["targets"]) - {server}] == []

        events = logged_events(run)
        served = [e for e in events if e["src"] == server and e["kind"] == "phase" and e["ts"] >= began]
        assert served and served[-1]["phase"] == "POST /generate", served  # in flight, not idle
        waits = [e for e in events if e["src"] == rollouter and e["kind"] == "phase" and e.get("waits_on")]
        request = HttpWait.parse(waits[-1]["waits_on"][0])
        assert request is not None and (request.method, request.path, request.pid) == ("POST", "/generate", pid)
        said = f"waiting for POST /generate on {request.address} (pid {pid}: ray::InferenceServer"
        assert said in waits[-1]["detail"], waits[-1]
        state = RunState()
        for e in events:
            state.apply(wire.validate_dict(e))
        assert [edge.target for edge in wait_graph(state)[rollouter]] == [server]
        assert "never-in-the-log" not in (run / "events.jsonl").read_text()  # the query string

        status = gkd_tui("status", str(run))
        assert f"held by  an inference request in a server: {server}, 1 POST /generate in flight" in status.stdout, \
            status.stdout
        row = next(line for line in status.stdout.splitlines() if line.startswith(f"{server} "))
        age = float(re.search(r"POST /generate\s+(\d+(?:\.\d+)?)s", row)[1])
        assert age >= MIN_S, row  # measured from the stalled request's start
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)


@pytest.mark.timeout(HEALTHY_S + 200)
def test_a_tool_outside_ray_that_never_answers_is_named_by_its_address_and_process(gkd_home):
    """The code tool (a process outside Ray, the driver's child) stops answering: the rollout awaiting it is the
    worker named, with the tool's address, pid and command as the cause; the inference server is not named."""
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), str(HEALTHY_S), "tool",
                  "aiohttp")
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def said(what: str) -> str | None:
            log = run / "logs" / "driver.log"
            found = re.search(rf"{what} ([\d.]+)", log.read_text() if log.exists() else "")
            return found[1] if found else None

        began = float(wait_until(lambda: said("STALLED AT"), HEALTHY_S + 120, "the healthy rounds to end",
                                 every_s=1.0))
        tool_pid = int(said("TOOL PID"))

        def alarms() -> list[dict]:
            return [e for e in logged_events(run) if e["kind"] == "alert" and not e.get("cleared")
                    and e.get("severity") in ("warn", "critical")]

        named = wait_until(lambda: [a for a in alarms() if a["ts"] >= began], NAMED_WITHIN_S + 30,
                           "the stalled tool's wait named", every_s=0.5)
        first = named[0]
        assert first["ts"] - began <= NAMED_WITHIN_S, (first["ts"] - began, first["message"])
        assert first["code"] == "external_wait" and first["targets"][0].startswith("Rollouter"), first
        # the tool's program and script, never its arguments (a key can be one)
        assert re.search(rf"for POST /run on 127\.0\.0\.1:\d+ \(pid {tool_pid}: \S*python\S* "
                         rf"ray_http_pipeline\.py\), a server outside the job", first["message"]), first["message"]
        assert first["evidence"]["external"].startswith("POST /run on 127.0.0.1:"), first["evidence"]
        assert [a["targets"] for a in alarms() if not a["targets"][0].startswith("Rollouter")] == []

        status = gkd_tui("status", str(run))
        assert re.search(rf"held by  an external call: Rollouter/0 waits for POST /run on 127\.0\.0\.1:\d+ "
                         rf"\(pid {tool_pid}: ", status.stdout), status.stdout
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)
