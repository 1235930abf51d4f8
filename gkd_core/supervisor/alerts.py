"""The supervisor's side of the diagnosis: which alert events move the RunState to the findings.

The rules live in ``gkd_core.diagnosis``; the supervisor evaluates them on its RunState, emits an
`alert` event for each new or changed finding and a `cleared` event for each of its own that no
longer holds. So alerts are ordinary events: in the log, in snapshots, and replayed like
everything else.
"""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.state import RunState, alert_key
from gkd_core.telemetry.events import AlertEvent

OWNED = (*diagnosis.CODES, "ingest_rejected")


def evaluate(state: RunState, now: float, stall_s: float, heartbeat_s: float = 1.0) -> list[AlertEvent]:
    return diagnosis.diagnose(state, now, diagnosis.Settings(stall_s=stall_s, heartbeat_s=heartbeat_s))


def _changed(cur, a: AlertEvent) -> bool:
    if cur.severity != a.severity:
        return True
    if a.code in diagnosis.LIVE:  # the time in the message grows every second: a change only when it
        # has grown by half (a log scale: 6, 9, 14, 20 s ...) or the verdict or the place changed
        grown = a.evidence.get("elapsed_s", 0) > 1.5 * cur.evidence.get("elapsed_s", float("inf"))
        return grown or any(cur.evidence.get(k) != a.evidence.get(k) for k in ("verdict", "where"))
    return cur.message != a.message


def diff(state: RunState, wanted: list[AlertEvent]) -> list[AlertEvent]:
    """The events that move ``state.alerts`` (for the codes in OWNED) to ``wanted``."""
    out = []
    keys = set()
    for a in wanted:
        key = alert_key(a.code, a.targets)
        keys.add(key)
        cur = state.alerts.get(key)
        if cur is None or _changed(cur, a):
            out.append(a)
    for key, cur in state.alerts.items():
        if cur.code in OWNED and key not in keys and cur.code != "ingest_rejected":
            out.append(AlertEvent(code=cur.code, targets=list(cur.targets), severity=cur.severity,
                                  message=cur.message, cleared=True))
    return out
