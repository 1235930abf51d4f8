"""Which heartbeats go into ``events.jsonl``.

Every heartbeat reaches the live state and the subscribers; the log keeps what a replay and a
diagnosis need and not one line per worker per second (at 8 workers that is most of the log's
bytes on a real run, where steps take seconds). A worker's heartbeat is logged when:

- it is the worker's first, or ``every_s`` have passed since its last logged one;
- something a rule reads changed: CPU crossing the idle line (the "stuck" verdict), the
  dropped-events count, or RSS by more than ``RSS_STEP`` (a leak stays visible); the beat before
  it is restated first (the phase is not among them: the reducer takes it from `phase` events,
  which are all logged);
- the worker has fallen silent: its newest heartbeat, held back so far, is restated (logged and
  published again, with a new ``seq`` and its own ``ts``), so the log says when it was last
  heard from to within a beat, which is what "frozen for 12 s" is measured from.

A replay fills the gaps between two logged heartbeats of a worker that are at most
``every_s`` plus a silence apart (see ``gkd_tui.sources.replay``): the run's ``run`` events
carry both periods.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from gkd_core.state import CPU_IDLE_PCT, WorkerState
from gkd_core.telemetry.events import Beat, HeartbeatEvent

RSS_STEP = 64 << 20  # bytes of RSS change that are worth a line of their own
SILENT_BEATS = 2.5  # a worker this many heartbeat periods quiet has fallen silent
# a worker's heartbeat: an event of its own, or a beat of its node's batch (the same numbers)
Heartbeat = HeartbeatEvent | Beat


@dataclass(slots=True)  # one per worker, read for each of its beats
class _Src:
    logged: Heartbeat  # the last one logged
    last: Heartbeat  # the last full one received: a ``same`` beat says what it did, at another time
    held: Heartbeat | None = None  # the newest not logged, a full one
    same_at: float = 0.0  # or: the newest not logged is ``last`` at this time (a ``same`` beat)
    held_at: float = 0.0  # monotonic time the held one arrived

    def take_held(self) -> Heartbeat | None:
        """The newest beat not logged (made from ``last`` for a ``same`` one), and it is held no more."""
        held, self.held = self.held, None
        if self.same_at:
            held, self.same_at = at(self.last, self.same_at), 0.0
        return held


def at(beat: Heartbeat, ts: float) -> Heartbeat:
    """``beat`` said again at ``ts``: a ``same`` beat as the log keeps it (its time in phase grown with it).
    Without its memory reading: its scope's numbers at ``ts`` came with another worker's beat (the reducer
    keeps the worker's own reading when a beat has none), and old ones at a newer time would be taken as
    the scope's newest by a replay."""
    return msgspec.structs.replace(beat, ts=ts, elapsed=beat.elapsed + max(0.0, ts - beat.ts), mem=None)


@dataclass
class HeartbeatLog:
    every_s: float = 10.0  # 0: every heartbeat is logged
    heartbeat_s: float = 1.0
    _srcs: dict[str, _Src] = field(default_factory=dict)

    def admit(self, e: Heartbeat, mono: float | None = None) -> tuple[bool, Heartbeat | None]:
        """(log this heartbeat now?, the same worker's held one to restate first). A change is logged
        with the beat before it: a CPU share is of the interval since that one, and "idle since" is
        measured from it."""
        s = self._srcs.get(e.src)
        if s is None:
            self._srcs[e.src] = _Src(e, e)
            return True, None
        if self.every_s <= 0 or e.ts - s.logged.ts >= self.every_s - self.heartbeat_s / 2:
            s.take_held()
            s.logged = s.last = e
            return True, None
        if self._changed(s.logged, e):
            before = s.take_held()
            s.logged = s.last = e
            return True, before
        s.same_at = 0.0
        s.held, s.held_at, s.last = e, time.monotonic() if mono is None else mono, e
        return False, None

    def admit_all(self, beats: list[Beat], into: list[Heartbeat], mono: float | None = None,
                  same: Sequence[tuple[str, float]] = ()) -> None:
        """``admit`` for each of a batch's beats, at the cost of one: appends to ``into`` what the log
        keeps, each held beat to restate before the change that follows it; then its ``same`` beats
        (``HeartbeatsEvent.same``), kept as beats when one is due. (65,536 beats a second at the largest:
        the loop is ``admit``'s, inline.)"""
        if self.every_s <= 0:
            for e in beats:
                self.admit(e)
                into.append(e)
            into.extend(at(s.last, ts) for src, ts in same
                        if (s := self._srcs.get(src)) is not None and ts > s.last.ts)
            return
        mono = time.monotonic() if mono is None else mono
        srcs, due_s = self._srcs, self.every_s - self.heartbeat_s / 2
        for e in beats:
            s = srcs.get(e.src)
            if s is None:
                srcs[e.src] = _Src(e, e)
                into.append(e)
                continue
            last = s.logged
            if e.ts - last.ts >= due_s:
                s.held, s.same_at = None, 0.0
                s.logged = e
                into.append(e)
            elif ((e.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT) or e.dropped != last.dropped
                  or abs(e.rss - last.rss) > RSS_STEP):  # (``_changed``)
                held = s.take_held()
                if held is not None:
                    into.append(held)
                s.logged = e
                into.append(e)
            else:
                s.held, s.same_at, s.held_at = e, 0.0, mono
            s.last = e
        for src, ts in same:
            s = srcs.get(src)
            if s is None or ts <= s.last.ts:
                continue  # what it says is not known here (a supervisor that took over): its next full beat
            if ts - s.logged.ts >= due_s:
                s.logged = s.last = at(s.last, ts)
                s.held, s.same_at = None, 0.0
                into.append(s.last)
            else:
                s.held, s.same_at, s.held_at = None, ts, mono

    def seed(self, workers: Iterable[WorkerState]) -> None:
        """Each worker's newest heartbeat as the state says it (a run taken over: read from its log): what
        its ``same`` beats say, before its next full one comes. Its next beat, full or ``same``, is logged,
        as a first one is."""
        for w in workers:
            if w.last_heartbeat and w.src not in self._srcs:
                b = Beat(w.src, w.last_heartbeat, w.phase, 0.0, w.rss, w.cpu, w.dropped)
                self._srcs[w.src] = _Src(msgspec.structs.replace(b, ts=-math.inf), b)

    @staticmethod
    def _changed(last: Heartbeat, e: Heartbeat) -> bool:
        return ((e.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT)
                or e.dropped != last.dropped
                or abs(e.rss - last.rss) > RSS_STEP)

    def silent(self, mono: float | None = None) -> list[Heartbeat]:
        """The held heartbeats of workers heard from no more since: to restate now (each once)."""
        now = time.monotonic() if mono is None else mono
        limit = SILENT_BEATS * self.heartbeat_s
        out = []
        for s in self._srcs.values():
            if (s.held is not None or s.same_at) and now - s.held_at > limit:
                held = s.take_held()
                assert held is not None
                out.append(held)
                s.logged = held
        return out

    def held(self) -> list[Heartbeat]:
        """Every heartbeat still held back (at the end of a run: restate them all)."""
        return self.silent(float("inf"))
