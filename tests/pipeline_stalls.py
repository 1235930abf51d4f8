"""The stalled async pipeline (tests/jobs/ray_async_pipeline.py) under `gkd-tui launch --`, stalled by one cause
and checked as #55 asks: named within 15 s of the stall as its own kind of finding, the trainer at the queue's
end and the driver blocked by it and never named, and nothing said before the stall. Run with this job's own
queue and in slime's shape (tests/ray/test_pipeline_stalls.py), and with verl's MessageQueue (tests/on_verl)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir

JOB = Path(__file__).resolve().parent / "jobs" / "ray_async_pipeline.py"
HEALTHY_S = 15  # the pipeline's healthy time before the stall
NAMED_WITHIN_S = 15  # #55: the cause named within 15 s of the stall
# what names each cause: its finding's code, the worker it names (by its name's start), and what its message says
CAUSES = {
    "server": ("slower_than_usual", "InferenceServer/", r"still in POST /generate"),
    "tool": ("external_wait", "Rollouter/", r"for POST /run on 127\.0\.0\.1:\d+ \(pid TOOL: \S*python\S* "
                                            r"ray_async_pipeline\.py\), a server outside the job"),
    "rank": ("collective_not_joined", "Trainer/1", r"Trainer/1 has not joined all_reduce #\d+"),
    "gate": ("producer_parked", "Rollouter/", r"waits on an asyncio\.Condition in run \(ray_async_pipeline\.py:\d+; "
                                              r"its numbers: produced=\d+, param_version=\d+\).*only Trainer/0's calls "
                                              r"of update_param_version open it"),
}


# slime's shape (the job's --slime): the rollouter and the queue are one threaded actor, its producer a thread
SLIME_CAUSES = {
    "server": CAUSES["server"],
    "tool": ("external_wait", "RolloutManager/", CAUSES["tool"][2]),
    "rank": CAUSES["rank"],
    "gate": ("producer_parked", "RolloutManager/",
             r"waits on a queue\.Queue in get_sample \(ray_async_pipeline\.py:\d+\), fed by its thread "
             r"rollout-producer, which is waiting on a threading\.Condition in pass_gate \(ray_async_pipeline\.py:\d+; "
             r"its numbers: produced=\d+, param_version=\d+\); only Trainer/0's calls of update_param_version open "
             r"it, and Trainer/0 waits on RolloutManager/0\.get_sample, whose queue only RolloutManager/0's thread "
             r"rollout-producer fills"),
}


# slime's shape with its producer a Ray task (the job's --slime-tasks): its worker named by its function
SLIME_TASK_CAUSES = {
    **SLIME_CAUSES,
    "tool": ("external_wait", "produce/", CAUSES["tool"][2]),
    "gate": ("producer_parked", "RolloutManager/",
             r"RolloutManager/0\.pass_gate #\d+ waits on a threading\.Condition in pass_gate \(ray_async_pipeline\.py:"
             r"\d+; its numbers: produced=\d+, param_version=\d+\).*; only Trainer/0's calls of update_param_version "
             r"open it, and Trainer/0 waits on RolloutManager/0\.get_sample, another call of RolloutManager/0's"),
}
SHAPES = {"--slime": SLIME_CAUSES, "--slime-tasks": SLIME_TASK_CAUSES}


def launched(healthy_s: float, cause: str, *args: str) -> Path:
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), str(healthy_s), cause, *args)
    assert got.returncode == 0, got.stderr
    return rundir.resolve_run(None)


def said(run: Path, what: str) -> str | None:
    """What the job's driver printed after ``what`` (``STALLED AT``, ``TOOL PID``), once it has."""
    log = run / "logs" / "driver.log"
    found = re.search(rf"{what} ([\d.]+)", log.read_text() if log.exists() else "")
    return found[1] if found else None


def alarms(run: Path) -> list[dict]:
    return [e for e in logged_events(run) if e["kind"] == "alert" and not e.get("cleared")
            and e.get("severity") in ("warn", "critical")]


def stalled_and_named(cause: str, *args: str) -> None:
    code, culprit, message = next((SHAPES[a] for a in args if a in SHAPES), CAUSES)[cause]
    run = launched(HEALTHY_S, cause, *args)
    try:
        began = float(wait_until(lambda: said(run, "STALLED AT"), HEALTHY_S + 150, "the healthy steps to end",
                                 every_s=1.0))
        early = [(a["code"], a["targets"], a["message"]) for a in alarms(run) if a["ts"] < began]
        assert early == [], early  # the healthy steps (said in full: this helper's asserts are not rewritten)

        named = wait_until(lambda: [a for a in alarms(run) if a["ts"] >= began], NAMED_WITHIN_S + 30,
                           f"the {cause}'s stall named", every_s=0.5)
        first = named[0]
        assert first["ts"] - began <= NAMED_WITHIN_S, (first["ts"] - began, first["message"])
        assert first["code"] == code and first["targets"][0].startswith(culprit), first
        assert re.search(message.replace("TOOL", said(run, "TOOL PID") or "?"), first["message"]), first["message"]
        # the trainer at the queue's end, and the driver, are blocked by the cause, never named
        time.sleep(1.5)  # (a pass after the first: the blocked come with the chain, not all in the first)
        latest = {(a["code"], tuple(a["targets"])): a for a in alarms(run)}
        assert {targets[0] for _, targets in latest} == {first["targets"][0]}, sorted(latest)
        blocked = set(latest[(code, tuple(first["targets"]))]["evidence"]["blocked"])
        assert {"Trainer/0", "driver"} <= blocked, blocked
    finally:
        gkd_tui("stop", str(run))
        time.sleep(0.5)
