"""Who was named for a fault, judged from ``events.jsonl`` alone: the chaos suite and the random trials
(bench/chaos_trials.py) both ask it, so one reading says "the right process".

A fault is named by the first **critical** alert after it, or by the driver's own word that it started the
process again (``restarted_by_driver``: a warning, since nothing is left for the user to do), or by a finding that
is a warning by its nature (``slower_than_peers``: the run goes on, at the slow worker's pace). It is named
right when the process hit is in that alert's **targets**. A message that mentions the process is not a
naming: "rollout/1 still in generate; waiting for student/0" names rollout/1.

Each naming is also told apart by where it comes from: the diagnosis inferring the cause (a rule reading
the heartbeats, Ray's view, the collectives), or the driver reporting what it saw happen (its worker's
exception that ended it, its own restart of a worker). Both are fine for a user; they are counted apart.
"""

from __future__ import annotations

from typing import NamedTuple

from gkd_core.vocab import ALERTS

# the driver's own reports: ``driver_failed`` is the rules' word for the driver's exit, whose target is the
# worker its error names; ``restarted_by_driver`` is raised by the driver itself
REPORTED_BY_DRIVER = ("driver_failed", *(code for code, c in ALERTS.items() if c.by == "driver"))
HEALED = "restarted_by_driver"  # a naming though a warning: the driver started the process hit again
# findings that are warnings by their nature, yet name a fault: a naming, and a false alarm where no fault was made
WARNING_FINDINGS = ("slower_than_peers",)
WARNING_NAMINGS = (HEALED, *WARNING_FINDINGS)


class Naming(NamedTuple):
    code: str
    targets: list[str]
    message: str
    severity: str
    after_s: float  # from the fault to the alert
    right: bool  # the process hit is in its targets
    by: str  # "diagnosis" or "driver"


def hits(targets: list[str], src: str) -> bool:
    """``src`` is one of ``targets``; a name ending in a slash is a role (``agent/``: the node's agent)."""
    return any(t == src or (src.endswith("/") and t.startswith(src)) for t in targets)


def is_naming(e: dict) -> bool:
    """An alert raised (not cleared) that names a fault: critical, or a warning that names one by its nature."""
    return (e.get("kind") == "alert" and not e.get("cleared") and bool(e.get("targets"))
            and (e.get("severity") == "critical" or e.get("code") in WARNING_NAMINGS))


def first_naming(events: list[dict], t0: float, src: str) -> Naming | None:
    """The first naming at or after ``t0`` (wall clock), judged against ``src``; None when none yet."""
    for e in events:
        if e["ts"] >= t0 and is_naming(e):
            return Naming(e["code"], list(e["targets"]), e.get("message", ""), e.get("severity", ""),
                          round(e["ts"] - t0, 2), hits(e["targets"], src),
                          "driver" if e["code"] in REPORTED_BY_DRIVER else "diagnosis")
    return None


def alarms_in(events: list[dict], t0: float, t1: float) -> list[dict]:
    """Every critical alert raised in ``[t0, t1)``, and every warning that is a naming by its nature (not the
    driver's word that it healed a fault, which is no finding): in a healthy stretch, each is a false alarm."""
    return [e for e in events if t0 <= e["ts"] < t1 and e.get("kind") == "alert" and not e.get("cleared")
            and (e.get("severity") == "critical" or e.get("code") in WARNING_FINDINGS)]


def criticals(events: list[dict], t0: float, t1: float) -> list[dict]:
    """Every critical alert raised in ``[t0, t1)``."""
    return [e for e in events if t0 <= e["ts"] < t1 and e.get("kind") == "alert" and not e.get("cleared")
            and e.get("severity") == "critical"]
