"""The supervisor's side of the diagnosis: which alert events move the RunState to the findings.

The rules live in ``gkd_core.diagnosis``; the supervisor evaluates them on its RunState, emits an
`alert` event for each new or changed finding and a `cleared` event for each of its own that no
longer holds. So alerts are ordinary events: in the log, in snapshots, and replayed like
everything else.
"""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent


def evaluate(state: RunState, now: float, stall_s: float, heartbeat_s: float = 1.0) -> list[AlertEvent]:
    return diagnosis.diagnose(state, now, diagnosis.Settings(stall_s=stall_s, heartbeat_s=heartbeat_s))


def diff(state: RunState, wanted: list[AlertEvent]) -> list[AlertEvent]:
    """The events that move ``state.alerts`` (for the diagnosis' own codes) to ``wanted``; the
    supervisor's `ingest_rejected` and `auth_refused` stay on record once raised."""
    return diagnosis.changes(state, wanted)
