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

A relay's clock (``RelayClock``: the beats its workers sent that said nothing new) is kept the same
way (``ClockLog``): each change of its roster (who joined, who went quiet, a new epoch) at once, its
time every ``every_s``, and its newest restated when the relay falls silent.

A replay fills the gaps between two logged heartbeats of a worker, or two clocks of a relay, that are
at most ``every_s`` plus a silence apart (``runlog.timeline``): the run's ``run`` events carry both
periods.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gkd_core.state import CPU_IDLE_PCT
from gkd_core.telemetry.events import FULL_BEAT_S, Beat, HeartbeatEvent, RelayClock

RSS_STEP = 64 << 20  # bytes of RSS change that are worth a line of their own
SILENT_BEATS = 2.5  # a worker this many heartbeat periods quiet has fallen silent
# a worker's heartbeat: an event of its own, or a beat of its node's batch (the same numbers)
Heartbeat = HeartbeatEvent | Beat


@dataclass(slots=True)  # one per worker, read for each of its full beats
class _Src:
    logged: Heartbeat  # the last one logged
    held: Heartbeat | None = None  # the newest not logged
    held_at: float = 0.0  # monotonic time the held one arrived
    # a relay's clock vouches for it: its full beats are seconds apart, and its silence is the relay's to say
    clocked: bool = False

    def take_held(self) -> Heartbeat | None:
        """The newest beat not logged, and it is held no more."""
        held, self.held = self.held, None
        return held


class ClockLog:
    """Which relays' clocks (``RelayClock``) the log keeps: one that changes its roster or its epoch at
    once (a worker joined or went quiet: a change of what the clock vouches for), and its time every
    ``every_s``; the newest held back is restated when its relay falls silent, and at the run's end."""

    def __init__(self, every_s: float, heartbeat_s: float):
        self.every_s, self.heartbeat_s = every_s, heartbeat_s
        self._logged: dict[str, RelayClock] = {}
        self._held: dict[str, tuple[RelayClock, float]] = {}  # with the monotonic time it came

    def admit(self, clocks: Sequence[RelayClock], into: list[RelayClock], mono: float | None = None) -> None:
        due_s = self.every_s - self.heartbeat_s / 2
        for c in clocks:
            last = self._logged.get(c.relay)
            if (last is None or self.every_s <= 0 or c.joined or c.quiet or c.epoch != last.epoch
                    or c.ts - last.ts >= due_s):
                into.append(c)
                self._logged[c.relay] = c
                self._held.pop(c.relay, None)
            elif c.ts > last.ts:
                self._held[c.relay] = (c, time.monotonic() if mono is None else mono)

    def silent(self, mono: float | None = None) -> list[RelayClock]:
        """The held clocks of relays heard from no more since: to restate now (each once)."""
        now = time.monotonic() if mono is None else mono
        limit = SILENT_BEATS * self.heartbeat_s
        gone = [relay for relay, (_, came) in self._held.items() if now - came > limit]
        out = []
        for relay in gone:
            c, _ = self._held.pop(relay)
            self._logged[relay] = c
            out.append(c)
        return out


@dataclass
class HeartbeatLog:
    every_s: float = 10.0  # 0: every heartbeat is logged
    heartbeat_s: float = 1.0
    _srcs: dict[str, _Src] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clocks = ClockLog(self.every_s, self.heartbeat_s)  # the relays' clocks, kept alike

    def admit(self, e: Heartbeat, mono: float | None = None) -> tuple[bool, Heartbeat | None]:
        """(log this heartbeat now?, the same worker's held one to restate first). A change is logged
        with the beat before it: a CPU share is of the interval since that one, and "idle since" is
        measured from it."""
        s = self._srcs.get(e.src)
        if s is None:
            self._srcs[e.src] = _Src(e)
            return True, None
        if self.every_s <= 0 or e.ts - s.logged.ts >= self.every_s - self.heartbeat_s / 2:
            s.take_held()
            s.logged = e
            return True, None
        if self._changed(s.logged, e):
            before = s.take_held()
            s.logged = e
            return True, before
        s.held, s.held_at = e, time.monotonic() if mono is None else mono
        return False, None

    def admit_all(self, beats: list[Beat], into: list[Heartbeat], mono: float | None = None,
                  clocked: bool = False) -> None:
        """``admit`` for each of a batch's beats, at the cost of one: appends to ``into`` what the log
        keeps, each held beat to restate before the change that follows it. (The loop is ``admit``'s,
        inline: tens of thousands of full beats a second at the largest.) ``clocked``: a relay's clock
        vouches for the workers of the batch (``quiet`` says when it no longer does)."""
        if self.every_s <= 0:
            for e in beats:
                self.admit(e)
                into.append(e)
                self._srcs[e.src].clocked = clocked
            return
        mono = time.monotonic() if mono is None else mono
        srcs, due_s = self._srcs, self.every_s - self.heartbeat_s / 2
        for e in beats:
            s = srcs.get(e.src)
            if s is None:
                srcs[e.src] = _Src(e, clocked=clocked)
                into.append(e)
                continue
            s.clocked = clocked
            last = s.logged
            if e.ts - last.ts >= due_s:
                s.held = None
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
                s.held, s.held_at = e, mono

    @staticmethod
    def _changed(last: Heartbeat, e: Heartbeat) -> bool:
        return ((e.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT)
                or e.dropped != last.dropped
                or abs(e.rss - last.rss) > RSS_STEP)

    def silent(self, mono: float | None = None) -> list[Heartbeat]:
        """The held heartbeats of workers heard from no more since: to restate now (each once). A worker a
        relay's clock vouches for is said quiet by its relay (``quiet``), and its full beats come up to
        ``FULL_BEAT_S`` and a batch's wait apart: its held one is restated here only when none came for that
        long besides (its relay gone without a word, or its word lost)."""
        now = time.monotonic() if mono is None else mono
        limit = SILENT_BEATS * self.heartbeat_s
        clocked_limit = limit + FULL_BEAT_S + 2 * self.heartbeat_s  # (2 periods: a batch's own wait, and one)
        out = []
        for s in self._srcs.values():
            if s.held is not None and now - s.held_at > (clocked_limit if s.clocked else limit):
                out.append(self._restate(s))
        return out

    def quiet(self, src: str) -> Heartbeat | None:
        """Its relay says it quiet: its held beat (its last numbers) to restate with that, and from now on its
        silence is its own to find."""
        s = self._srcs.get(src)
        if s is None:
            return None
        s.clocked = False
        return self._restate(s) if s.held is not None else None

    def held(self) -> list[Heartbeat]:
        """Every heartbeat still held back (at the end of a run: restate them all)."""
        return [self._restate(s) for s in self._srcs.values() if s.held is not None]

    @staticmethod
    def _restate(s: _Src) -> Heartbeat:
        held = s.take_held()
        assert held is not None
        s.logged = held
        return held
