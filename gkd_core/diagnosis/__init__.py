"""Diagnosis: rules that turn a RunState into findings, in seconds rather than at a deadline.

``diagnose(state, now)`` runs every rule in ``rules.RULES``; each is a pure function of the
RunState and ``now`` returning alerts with their evidence and hint. The supervisor runs it for gkd
runs, the Ray-state source for jobs it only observes (DESIGN §4).
"""

from __future__ import annotations

from gkd_core.diagnosis.rules import CODES, LIVE, RULES, Settings
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent

__all__ = ["CODES", "LIVE", "Settings", "diagnose"]


def diagnose(state: RunState, now: float, settings: Settings = Settings()) -> list[AlertEvent]:
    out: list[AlertEvent] = []
    for rule in RULES:
        out.extend(rule(state, now, settings))
    # "slower than usual" is for when nothing else explains the wait: once a rule names a cause (a
    # straggler, a teacher that does not serve, a dead actor), the workers waiting on it are not named
    if any(a.targets and a.severity != "info" and a.code != "slower_than_usual" for a in out):
        out = [a for a in out if a.code != "slower_than_usual"]
    return out
