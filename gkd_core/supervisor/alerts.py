"""The supervisor's side of the diagnosis: which alert events move the RunState to the findings.

The rules live in ``gkd_core.diagnosis``; the supervisor evaluates them on its RunState, emits an
`alert` event for each new or changed finding and a `cleared` event for each of its own that no
longer holds. So alerts are ordinary events: in the log, in snapshots, and replayed like
everything else.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.telemetry.wire import RejectCounter


def evaluate(state: RunState, now: float, stall_s: float, heartbeat_s: float = 1.0,
             setup_s: float = diagnosis.Settings().setup_s,
             between: Callable[[], object] | None = None) -> list[AlertEvent]:
    return diagnosis.diagnose(state, now, diagnosis.Settings(stall_s=stall_s, heartbeat_s=heartbeat_s, setup_s=setup_s),
                              between)


def diff(state: RunState, wanted: list[AlertEvent]) -> list[AlertEvent]:
    """The events that move ``state.alerts`` (for the diagnosis' own codes) to ``wanted``; the
    supervisor's `ingest_rejected` and `auth_refused` stay on record once raised."""
    return diagnosis.changes(state, wanted)


def refusals(rejects: RejectCounter, auth_refused: int) -> list[AlertEvent]:
    """The supervisor's own findings: messages its ingest refused, tcp connections without the run's key."""
    out = []
    if rejects.total:
        out.append(AlertEvent(
            severity="warn", code="ingest_rejected",
            message=f"{rejects.total} messages refused: "
                    + ", ".join(f"{k} {v}" for k, v in sorted(rejects.counts.items())),
            hint="unauthenticated: something without the run's key tried the tcp ingest (a stranger, or "
                 "a worker of another run); otherwise a sender speaks another protocol version or sends "
                 "corrupt data. Nothing of theirs was recorded; the run goes on",
        ))
    if auth_refused:
        out.append(AlertEvent(
            severity="warn", code="auth_refused",
            message=f"{auth_refused} tcp connection(s) refused: no valid CurveZMQ key",
            hint="only clients holding RUN/keys/client.key_secret may connect",
        ))
    return out


PASSES_KEPT = 4096  # a pass a second at the most: over an hour of them


class PassTimes:
    """How long each of the diagnosis's passes took (its own time, not the ingest's taken in between rules), the
    newest ``PASSES_KEPT`` with when each ended: the supervisor's snapshot says them, and bench_dashboard reports
    their p50, p99 and max beside the screen's latency (a pass that walks every worker is what makes its tail)."""

    def __init__(self) -> None:
        self._taken: collections.deque[tuple[float, float]] = collections.deque(maxlen=PASSES_KEPT)

    def add(self, took_s: float) -> None:
        self._taken.append((time.time(), took_s))

    def said(self) -> list[tuple[float, float]]:
        """(when it ended, wall clock; its milliseconds) of each pass kept, oldest first."""
        return [(round(t, 3), round(took * 1000, 2)) for t, took in self._taken]
