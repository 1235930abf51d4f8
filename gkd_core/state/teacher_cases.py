"""The reducer's case for the teacher's counts: each side's newest (the client's, the server's), when each last
moved, the server workers whose every answer lately was an error, and the teacher's point of the series once a
second. ``reducer.HANDLERS`` holds it with the others."""

from __future__ import annotations

from gkd_core.state.records import TEACHER_HISTORY_KEEP, TeacherSide, TeacherState
from gkd_core.state.run_record import RunRecord
from gkd_core.state.series import TeacherPoint
from gkd_core.telemetry import events as ev


def on_teacher(st: RunRecord, e: ev.TeacherEvent) -> None:
    t = st.teacher
    key = f"{e.side}:{e.src}"
    old = t.by_src.get(key)
    if old is not None and (e.sent < old.sent or e.completed < old.completed or e.received < old.received
                            or e.served < old.served):
        old = None  # counts that went down are a new process's (a restarted driver, a teacher started again)
    side = TeacherSide(
        sent=e.sent, completed=e.completed, failed=e.failed, timed_out=e.timed_out or 0, in_flight=e.in_flight,
        received=e.received, served=e.served, queue_depth=e.queue_depth, workers=dict(e.workers),
        errors=dict(e.errors), latency_ms=dict(e.latency_ms), ts=e.ts,
    )
    if e.errors or (old is not None and old.error_streaks):
        side.error_streaks = _error_streaks(old, side)
    moved = old is None or e.completed > old.completed or e.served > old.served
    owed = e.in_flight if e.side == "client" else e.queue_depth
    side.progress_at = e.ts if old is None or moved or not owed else old.progress_at  # (None: moved)
    side.received_at = e.ts if old is None or e.received > old.received else old.received_at
    side.sent_at = e.ts if old is None or e.sent > old.sent else old.sent_at
    t.by_src[key] = side
    if e.side == "client":
        total = sum(s.completed for k, s in t.by_src.items() if k.startswith("client:"))
        t.history.append((e.ts, total))
        if len(t.history) > TEACHER_HISTORY_KEEP:
            del t.history[0]
    if st.series.teacher_due(e.ts):
        st.series.note_teacher(_teacher_point(t, e.ts))


def _error_streaks(old: TeacherSide | None, new: TeacherSide) -> dict[str, tuple[float, int, float]]:
    """Each server worker whose answers since the last report were all errors: its streak goes on (begun at this
    report if it is new); one that answered well since ends it; one that answered nothing keeps it (the rule
    lets it go once its last error is old: a worker that erred, then died or was left idle)."""
    streaks = dict(old.error_streaks) if old is not None else {}
    for worker, errors in new.errors.items():
        erred = errors - (old.errors.get(worker, 0) if old is not None else 0)
        answered = new.workers.get(worker, 0) - (old.workers.get(worker, 0) if old is not None else 0)
        if answered > erred:
            streaks.pop(worker, None)
        elif erred > 0:
            since, count, _ = streaks.get(worker, (new.ts, 0, new.ts))
            streaks[worker] = (since, count + erred, new.ts)
    for worker in [w for w in streaks if w not in new.errors]:
        del streaks[worker]  # a new proxy's counts (the old one's workers gone)
    return streaks


def _teacher_point(t: TeacherState, ts: float) -> TeacherPoint:
    p50 = p99 = None
    queue = in_flight = 0
    for key, side in t.by_src.items():
        if key.startswith("client:"):
            in_flight += side.in_flight
            if "p50" in side.latency_ms:
                p50 = max(p50 or 0.0, side.latency_ms["p50"])
            if "p99" in side.latency_ms:
                p99 = max(p99 or 0.0, side.latency_ms["p99"])
        else:
            queue += side.queue_depth
    return TeacherPoint(ts, p50, p99, queue, in_flight)
