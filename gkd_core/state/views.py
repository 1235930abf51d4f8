"""Views of a ``RunRecord`` that depend on the clock or are derived (time in phase, heartbeat age, a
sync's elapsed time): pure, ``now`` comes from the caller, nothing stored."""

from __future__ import annotations

import math
import statistics
import sys

from gkd_core.state.records import (
    AlertState,
    CollectiveView,
    GpuRow,
    MetricsPoint,
    StackRecord,
    SyncState,
    SyncView,
    TeacherTotals,
    WorkerState,
)
from gkd_core.state.run_record import RunRecord
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import Dumped
from gkd_core.telemetry.events import FULL_BEAT_S
from gkd_core.vocab import SEVERITY_ORDER, SYNC_OPEN, WORKER_ENDED


def heartbeat_at(st: RunRecord, w: WorkerState) -> float:
    """When its newest heartbeat was sent (0.0: never): its relay's clock while that vouches for it (a beat
    that said nothing new is not sent on its own: ``RelayClock``), else its own newest. The clock counts
    only up to ``st.vouch_s`` past the worker's own newest: a live worker's full beat comes every
    ``FULL_BEAT_S`` (and reaches the log every ``heartbeat_log_s``), so a worker whose relay said it quiet
    in a message that was lost (to a supervisor that died with it) falls silent that much later, not never."""
    if w.clock_via and w.last_heartbeat:  # (a worker said to join whose first beat was lost: never heard)
        clock = st.relay_clocks.get(w.clock_via)
        if clock is not None and clock[1] > w.last_heartbeat:
            return min(clock[1], w.last_heartbeat + st.vouch_s)
    return w.last_heartbeat


def vouch_s(heartbeat_s: float, heartbeat_log_s: float) -> float:
    """``RunRecord.vouch_s`` for a run of these periods: the longest a healthy worker's full beats are
    apart in the log (a logged one every ``heartbeat_log_s``, the next full one up to ``FULL_BEAT_S`` after
    it is due), and a few beats to spare."""
    return heartbeat_log_s + FULL_BEAT_S + 3 * heartbeat_s


def heard_from(st: RunRecord, w: WorkerState) -> float:
    """When the process was last heard from (0.0: never a heartbeat): its newest heartbeat, or the start of
    its phase when that is newer. A phase is said by the process itself, through the thread that sends
    its heartbeats, so it is a sign of life too; and a worker that registers under the name of one that
    died (a restart, a teacher started again) is heard from at its own start, not judged by the dead
    one's last beat while its first is still on the way (a node's relay sends heartbeats once a second,
    everything else at once)."""
    beat = heartbeat_at(st, w)
    return max(beat, w.phase_since) if beat else 0.0


def shown_phase(w: WorkerState) -> str:
    """Its phase as a person reads it: a worker held up by another's fault (waiting on it, or failed of it)
    says whose instead; one with calls in flight at once says how many (its time in phase is the oldest's)."""
    if w.blocked_by:
        return f"blocked by {w.blocked_by}"
    if w.in_flight > 1 and w.phase not in WORKER_ENDED:
        return f"{w.in_flight} {w.phase} in flight"
    return w.phase or "-"


def usual_part_time(hist: list[SyncState], part: str) -> tuple[float, int] | None:
    """A sync part's usual time: the median, over the syncs that ended well (``sync_history``), of the
    slowest member's time in it, and how many syncs that is; None when none of them had the part."""
    took = [s.parts_took[part] for s in hist if s.state == "done" and part in s.parts_took]
    return (statistics.median(took), len(took)) if took else None


class RunViews(RunRecord):
    """What is derived from a ``RunRecord`` (no fields of its own, so the state stays one encoded object)."""

    def time_in_phase(self, w: WorkerState, now: float) -> float:
        return max(0.0, now - w.phase_since)

    def heartbeat_age(self, w: WorkerState, now: float) -> float | None:
        beat = heartbeat_at(self, w)
        return max(0.0, now - beat) if beat else None

    def workers_by_role(self) -> dict[str, list[WorkerState]]:
        out: dict[str, list[WorkerState]] = {}
        for w in sorted(self.workers.values(), key=lambda w: (w.role, w.rank if w.rank is not None else -1, w.src)):
            out.setdefault(w.role, []).append(w)
        return out

    def sync_view(self, now: float) -> SyncView | None:
        s = self.sync
        if s is None:
            return None
        running = s.state in SYNC_OPEN
        elapsed = s.elapsed_s + max(0.0, now - s.last_ts) if running else s.elapsed_s
        # a timeout of no length (or a corrupt one) is no fraction: past its end at once, never infinity
        frac = min(elapsed / s.timeout_s, 1e6) if s.timeout_s > 0 else 0.0
        frac = frac if math.isfinite(frac) else 0.0
        return SyncView(s.sync_id, s.state, elapsed, s.timeout_s, frac, list(s.pending), running)

    def collective_views(self) -> list[CollectiveView]:
        out = []
        for group, members in sorted(self.collectives.items()):
            n = max((p.entered for p in members.values()), default=0)
            if n == 0:
                continue
            at_n = {src: p for src, p in members.items() if p.entered == n}
            left = sorted(src for src, p in at_n.items() if p.left is not None and p.left >= n)
            out.append(CollectiveView(
                group, n, next((p.op for p in at_n.values() if p.op), "collective"),
                max(p.world for p in members.values()), sorted(set(at_n) - set(left)),
                sorted(src for src, p in members.items() if p.entered < n), left,
                min(p.entered_at for p in at_n.values())))
        return out

    def teacher_totals(self) -> TeacherTotals:
        tot = dict.fromkeys(("sent", "completed", "failed", "timed_out", "in_flight", "received", "served",
                             "queue_depth"), 0)
        lat: dict[str, float] = {}
        for key, side in self.teacher.by_src.items():
            for k in tot:
                tot[k] += getattr(side, k)
            if key.startswith("client:"):
                for q, v in side.latency_ms.items():
                    lat[q] = max(lat.get(q, 0.0), v)  # the slowest client is what the run feels
        return TeacherTotals(latency_ms=lat, **tot)

    def teacher_rate(self, window_s: float = 10.0) -> float:
        """Completed teacher requests per second over the last ``window_s`` of history."""
        h = self.teacher.history
        if len(h) < 2:
            return 0.0
        t1, c1 = h[-1]
        # the newest point at least window_s before the last; else the oldest
        t0, c0 = next(((t, c) for t, c in reversed(h[:-1]) if t1 - t >= window_s), h[0])
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0

    def hung_probes(self, now: float) -> list[tuple[str, str, float]]:
        """(node, probe, seconds not answering) for every probe stuck in a call, growing with ``now``;
        finite even for a sender's absurd count and clock (JSON has no infinity: an alert's evidence
        must read back as it was)."""
        return [(h.node, h.probe, min(h.seconds + max(0.0, now - h.at), sys.float_info.max))
                for _, h in sorted(self.probe_hangs.items())]

    def gpu_rows(self) -> list[GpuRow]:
        return [self.gpus[k] for k in sorted(self.gpus)]

    def active_alerts(self) -> list[AlertState]:
        """Most severe first, then oldest first."""
        return sorted(self.alerts.values(), key=lambda a: (SEVERITY_ORDER.get(a.severity, 3), a.since))

    def outcome(self, request: int) -> ev.ActionEvent | None:
        """The answer to the request with this id that its carrier gave (the driver's ``action`` event, not the
        supervisor's receipt that it handed the request on), once on record: the CLI, the dashboard and the bug
        report hear their answers here, from whichever event stream feeds the state."""
        for act in reversed(self.actions):
            if act.request == request and not act.is_receipt:
                return act
        return None

    def dump_records(self, dump_id: str) -> dict[str, StackRecord]:
        """The stacks dump ``dump_id`` took, by target, as far as the state still holds them: it keeps a worker's
        newest stack and the one before, and the diagnosis's own dump of a worker it names can land between a
        person's and their read of it."""
        got = {t: r for t, r in self.stacks_prev.items() if r.dump_id == dump_id}
        got.update({t: r for t, r in self.stacks.items() if r.dump_id == dump_id})
        return got

    def dump_answer(self, dump_id: str) -> Dumped | None:
        """The end of dump ``dump_id`` (its targets and folder), once on record: every stack it took is in
        ``stacks`` by then."""
        for act in reversed(self.actions):
            if isinstance(act.result, Dumped) and act.result.dump_id == dump_id:
                return act.result
        return None

    def recent_metrics(self, n: int = 60) -> list[MetricsPoint]:
        return self.metrics[-n:]
