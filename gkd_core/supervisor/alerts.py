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
             setup_s: float = diagnosis.Settings().setup_s) -> list[AlertEvent]:
    """A whole pass at once."""
    return begin(state, now, stall_s, heartbeat_s, setup_s).turn() or []


def judged_at(wall: float, newest: float, behind: bool) -> float:
    """The time a pass judges the state at: now, unless the supervisor is behind its ingest (its last read was cut off:
    more waits), when the state is as of the newest heartbeat it took in (``RunState.newest_beat``: the supervisor's
    own events carry its clock), not now. A silence whose end it has not read yet is not a silence: at 131,072
    workers a supervisor seconds behind would otherwise find every worker silent, and the alert for each would put
    it further behind."""
    return min(wall, newest) if behind and newest > 0 else wall


def begin(state: RunState, now: float, stall_s: float, heartbeat_s: float = 1.0,
          setup_s: float = diagnosis.Settings().setup_s) -> diagnosis.Pass:
    """A pass of the diagnosis over ``state`` at ``now``, with the run's periods, to take in turns."""
    return diagnosis.Pass(state, now, diagnosis.Settings(stall_s=stall_s, heartbeat_s=heartbeat_s, setup_s=setup_s))


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


ALERT_EVERY_S = 0.5
ALERT_SHARE_INV = 20  # the alerts' pass takes at most a twentieth of the supervisor's time
PASS_TURN_S = 0.01  # a turn of the alerts' pass: the rules it runs before the ingest is read again
# a pass due while the indexes have more than this left to take in (a burst: 131,072 workers' first beats, a step's
# phases) waits for them (``diagnosis.keep_up``, a slice a tick) up to PASS_WAIT_S: it would read the burst itself
PASS_BACKLOG = 4096
PASS_WAIT_S = 5.0


class Passes:
    """The supervisor's passes of the diagnosis: one every ALERT_EVERY_S, or less often when a pass costs more than
    a twentieth of that, taken in turns of PASS_TURN_S, one a tick of its loop, with the ingest read in between:
    the diagnosis never crowds out the events it reads, and no event waits for a whole pass."""

    def __init__(self) -> None:
        self.times = PassTimes()
        self.last_s = 0.0  # the newest pass's own time
        self._under_way: diagnosis.Pass | None = None
        self._began = 0.0  # (monotonic) when it began
        self._next = 0.0  # (monotonic) when the next is due
        self._waits_since = 0.0  # (monotonic) since when the one due waits for a burst to be taken in; 0: it does not

    def turn(self, now: float, begin: Callable[[], diagnosis.Pass], backlog: int = 0) -> list[AlertEvent] | None:
        """A turn of the pass under way, or of a new one (``begin``) when one is due and the indexes have no more
        than PASS_BACKLOG left to take in (``backlog``), or it has waited PASS_WAIT_S for them; its findings once it
        ends. A pass's time is its turns' and its beginning's (``begin``: the log's beats of those fallen silent since
        the last tick restated, the OOM watch's scopes read)."""
        if self._under_way is None:
            if now < self._next:
                return None
            if backlog > PASS_BACKLOG:
                self._waits_since = self._waits_since or now
                if now - self._waits_since < PASS_WAIT_S:
                    return None
            self._waits_since = 0.0
            start = time.perf_counter()
            self._under_way, self._began = begin(), now
            self._under_way.took_s += time.perf_counter() - start
        wanted = self._under_way.turn(PASS_TURN_S)
        if wanted is None:
            return None  # (the rest at the next tick)
        self.last_s, self._under_way = self._under_way.took_s, None
        self.times.add(self.last_s)
        self._next = self._began + max(ALERT_EVERY_S, ALERT_SHARE_INV * self.last_s)
        return wanted

    def drop(self) -> None:
        """Forget the pass under way (a whole one is taken in its place)."""
        self._under_way = None


PASSES_KEPT = 4096  # a pass a second at the most: over an hour of them


class PassTimes:
    """How long each of the diagnosis's passes took (its own time: its beginning's and its turns', not the ingest's
    read between them), the newest ``PASSES_KEPT`` with when each ended: the supervisor's snapshot says them, and
    bench_dashboard reports their p50, p99 and max beside the screen's latency (a pass that walks every worker is
    what makes its tail)."""

    def __init__(self) -> None:
        self._taken: collections.deque[tuple[float, float]] = collections.deque(maxlen=PASSES_KEPT)

    def add(self, took_s: float) -> None:
        self._taken.append((time.time(), took_s))

    def said(self) -> list[tuple[float, float]]:
        """(when it ended, wall clock; its milliseconds) of each pass kept, oldest first."""
        return [(round(t, 3), round(took * 1000, 2)) for t, took in self._taken]
