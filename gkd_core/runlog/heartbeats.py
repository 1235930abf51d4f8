"""Which heartbeats go into ``events.jsonl`` (``HeartbeatLog``), and how a replay puts back those it left out
(``Gaps``): the log's beat policy, both ways, in one place.

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
at most ``every_s`` plus a silence apart, with copies of the one before at the run's heartbeat period, so
that a heartbeat's age reads as it did live (``Gaps``, which ``runlog.timeline`` asks): the run's ``run``
events carry both periods. A worker that fell silent has no later heartbeat in the log to fill up to, and
ages as it did.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from gkd_core.state import CPU_IDLE_PCT, RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.events import FULL_BEAT_S, Beat, RelayClock
from gkd_core.vocab import RUN_GOING

RSS_STEP = 64 << 20  # bytes of RSS change that are worth a line of their own
SILENT_BEATS = 2.5  # a worker this many heartbeat periods quiet has fallen silent


@dataclass(slots=True)  # one per worker, read for each of its full beats
class _Src:
    logged: Beat  # the last one logged
    held: Beat | None = None  # the newest not logged
    held_at: float = 0.0  # monotonic time the held one arrived
    # a relay's clock vouches for it: its full beats are seconds apart, and its silence is the relay's to say
    clocked: bool = False

    def take_held(self) -> Beat | None:
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
        self._holds: collections.deque[tuple[float, str]] = collections.deque()  # (``HeartbeatLog._holds``)

    def admit(self, clocks: Sequence[RelayClock], into: list[RelayClock], mono: float | None = None) -> None:
        due_s, came = self.every_s - self.heartbeat_s / 2, time.monotonic() if mono is None else mono
        logged, held, holds = self._logged, self._held, self._holds
        for c in clocks:  # (a merged batch's: a clock of each of hundreds of relays)
            last = logged.get(c.relay)
            if (last is None or self.every_s <= 0 or c.joined or c.quiet or c.epoch != last.epoch
                    or c.ts - last.ts >= due_s):
                into.append(c)
                logged[c.relay] = c
                held.pop(c.relay, None)
            elif c.ts > last.ts:
                held[c.relay] = (c, came)
                holds.append((came, c.relay))

    def silent(self, mono: float | None = None) -> list[RelayClock]:
        """The held clocks of relays heard from no more since: to restate now (each once)."""
        now = time.monotonic() if mono is None else mono
        limit, holds, out = SILENT_BEATS * self.heartbeat_s, self._holds, []
        while holds and now - holds[0][0] > limit:
            came, relay = holds.popleft()
            held = self._held.get(relay)
            if held is not None and held[1] == came:  # (else held again since, or logged: not silent)
                del self._held[relay]
                self._logged[relay] = held[0]
                out.append(held[0])
        return out


@dataclass
class HeartbeatLog:
    every_s: float = 10.0  # 0: every heartbeat is logged
    heartbeat_s: float = 1.0
    _srcs: dict[str, _Src] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.clocks = ClockLog(self.every_s, self.heartbeat_s)  # the relays' clocks, kept alike
        # each beat held, as (when, its worker), in the order held, apart for workers a relay's clock vouches for
        # (their own limit): the oldest are the first to fall silent, so that ``silent`` reads those due, not every
        # worker. A worker held again since is there again; its older place is passed over when it comes due. (Its
        # name, not its record: a pair of a float and a str is no container the cycle collector follows, where one
        # that holds the record is, and tens of thousands a second of those, each held for seconds, made it walk
        # them again and again: a twentieth of the supervisor's time at 131,072 workers.)
        self._holds: tuple[collections.deque[tuple[float, str]], collections.deque[tuple[float, str]]] = (
            collections.deque(), collections.deque())

    def admit(self, e: Beat, mono: float | None = None) -> tuple[bool, Beat | None]:
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
        self._holds[s.clocked].append((s.held_at, e.src))
        return False, None

    def admit_all(self, beats: list[Beat], into: list[Beat], mono: float | None = None,
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
        srcs, due_s, holds = self._srcs, self.every_s - self.heartbeat_s / 2, self._holds[clocked]
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
                holds.append((mono, e.src))

    @staticmethod
    def _changed(last: Beat, e: Beat) -> bool:
        return ((e.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT)
                or e.dropped != last.dropped
                or abs(e.rss - last.rss) > RSS_STEP)

    def silent(self, mono: float | None = None) -> list[Beat]:
        """The held heartbeats of workers heard from no more since: to restate now (each once). A worker a
        relay's clock vouches for is said quiet by its relay (``quiet``), and its full beats come up to
        ``FULL_BEAT_S`` and a batch's wait apart: its held one is restated here only when none came for that
        long besides (its relay gone without a word, or its word lost)."""
        now = time.monotonic() if mono is None else mono
        limit = SILENT_BEATS * self.heartbeat_s
        clocked_limit = limit + FULL_BEAT_S + 2 * self.heartbeat_s  # (2 periods: a batch's own wait, and one)
        out, srcs = [], self._srcs
        for holds, clocked, due in ((self._holds[False], False, limit), (self._holds[True], True, clocked_limit)):
            while holds and now - holds[0][0] > due:
                at, src = holds.popleft()
                s = srcs[src]
                if s.held is not None and s.held_at == at and s.clocked == clocked:  # (else held again, or logged)
                    out.append(self._restate(s))
        return out

    def quiet(self, src: str) -> Beat | None:
        """Its relay says it quiet: its held beat (its last numbers) to restate with that, and from now on its
        silence is its own to find."""
        s = self._srcs.get(src)
        if s is None:
            return None
        s.clocked = False
        return self._restate(s) if s.held is not None else None

    def held(self) -> list[Beat]:
        """Every heartbeat still held back (at the end of a run: restate them all)."""
        return [self._restate(s) for s in self._srcs.values() if s.held is not None]

    @staticmethod
    def _restate(s: _Src) -> Beat:
        held = s.take_held()
        assert held is not None
        s.logged = held
        return held


# --- a replay: the gaps put back -----------------------------------------------------------------------


def _clock_at(c: RelayClock, ts: float) -> ev.HeartbeatsEvent:
    """A relay's clock alone, at ``ts``: what a gap in the log's clocks of it is filled with."""
    return ev.HeartbeatsEvent(src="supervisor", ts=ts, clocks=[RelayClock(c.relay, c.epoch, ts)])


def _copy_at(before: Beat | RelayClock, ts: float) -> ev.Event:
    """What the log left out at ``ts``: the beat before said again (its time in its phase grown with it), or
    the relay's clock at ``ts``."""
    if type(before) is RelayClock:
        return _clock_at(before, ts)
    assert type(before) is Beat
    return ev.event_of_beat(msgspec.structs.replace(before, ts=ts, elapsed=before.elapsed + (ts - before.ts)))


# a gap found: (when its first copy is due, a tie-breaker, the beat or clock to copy, when its next real one comes)
_Gap = tuple[float, int, "Beat | RelayClock", float]


class Gaps:
    """The heartbeats a log left out, put back as a replay applies its lines (``runlog.timeline``).

    ``seen(i, e, cursor)`` for each line decoded (``i`` its index; the replay has applied the lines before
    ``cursor``), ``applied(i)`` once line ``i`` is; ``next_due()`` and ``copy_due(ts)`` give the copies to
    apply in time order, between the lines. A worker's gap ends at its next logged beat; a relay's, at its
    next clock (or when the clock says a worker went quiet); a gap longer than ``longest`` was a silence and
    is not filled, nor one across a relay started again, nor across a new driver (its workers are others).
    """

    def __init__(self, heartbeat_s: float, every_s: float, state: RunState | None = None):
        """``state``: the keyframe's a replay starts from (its workers' and relays' latest, to fill up from)."""
        self.heartbeat_s, self.every_s = heartbeat_s, every_s
        self._due: list[_Gap] = []  # a heap: gaps the replay is in
        self._after: dict[int, list[tuple[Beat | RelayClock, float]]] = {}  # line -> gaps that start once applied
        self._n = itertools.count()
        # each worker's latest beat, and each relay's latest clock, so far: (its line, it); -1: the keyframe's
        self._beats: dict[str, tuple[int, Beat]] = {}
        self._clocks: dict[str, tuple[int, RelayClock]] = {}
        # a relay's clock seen: its workers' gaps are the clock's to fill, their full beats stay as live
        self._clocked = bool(state is not None and state.relay_clocks)
        if state is not None:
            for w in state.workers.values():
                if w.last_heartbeat and w.last_heartbeat >= state.running_since:
                    self._beats[w.src] = (-1, Beat(w.src, w.last_heartbeat, rss=w.rss, cpu=w.cpu, dropped=w.dropped))
            for relay, (epoch, ts) in state.relay_clocks.items():
                if ts >= state.running_since:
                    self._clocks[relay] = (-1, RelayClock(relay, epoch, ts))

    @property
    def longest(self) -> float:
        """A gap longer than this was a silence (0: the log kept every beat, there is nothing to fill)."""
        return self.every_s + (SILENT_BEATS + 1) * self.heartbeat_s if self.every_s else 0.0

    def seen(self, i: int, e: ev.Event | ev.UnknownEvent, cursor: int) -> None:
        if not self.every_s:
            return
        if type(e) is ev.HeartbeatEvent:
            self._gap(self._beats, e.src, i, ev.beat_of_event(e), cursor)
        elif type(e) is ev.HeartbeatsEvent:
            if e.clocks:
                self._clocked = True
            if not self._clocked:  # (a log from before relays' clocks: their workers' quiet beats were logged)
                for b in e.beats:
                    self._gap(self._beats, b.src, i, b, cursor)
            else:  # a vouched-for worker's full beat: its clock fills the gap before it, and one the log
                for b in e.beats:  # restates later (fallen silent) is filled from this one's numbers, not an
                    self._beats[b.src] = (i, b)  # older beat's, whose copies would undo a change in between
            for c in e.clocks:  # (a clock that says a worker quiet was held back by it since that one's time)
                until = min(c.ts, min(ts for _, ts in c.quiet)) if c.quiet else c.ts
                self._gap(self._clocks, c.relay, i, c, cursor, until)
        elif type(e) is ev.RunEvent and e.state in RUN_GOING:
            self._beats.clear()  # a new driver's workers: no gap to fill across it
            self._clocks.clear()

    def _gap(self, latest: dict, key: str, i: int, now: Beat | RelayClock, cursor: int,
             until: float | None = None) -> None:
        """A gap the log left in ``key``'s beats (or clocks) ends at ``now``: copies of the one before to put
        back, from the time that one is applied (at once when it already is), up to ``until`` (``now``'s time
        unless said)."""
        before = latest.get(key)
        if (before is not None and 1.5 * self.heartbeat_s < now.ts - before[1].ts <= self.longest
                and not (type(now) is RelayClock and now.epoch != before[1].epoch)):
            end = now.ts if until is None else until
            if end <= before[1].ts + self.heartbeat_s:
                pass  # (nothing to put back before it)
            elif before[0] < cursor:
                heapq.heappush(self._due, (before[1].ts + self.heartbeat_s, next(self._n), before[1], end))
            else:
                self._after.setdefault(before[0], []).append((before[1], end))
        latest[key] = (i, now)

    def applied(self, i: int) -> None:
        """Line ``i`` is applied: the gaps that start from it are under way."""
        for before, until in self._after.pop(i, ()):
            heapq.heappush(self._due, (before.ts + self.heartbeat_s, next(self._n), before, until))

    def next_due(self) -> float | None:
        return self._due[0][0] if self._due else None

    def copy_due(self, ts: float) -> ev.Event:
        """The next copy due by ``ts``, straight to the last of its gap due by then: the ones before it are
        overwritten by it (a copy changes its worker's heartbeat alone, and its next real one comes at the gap's
        end), so a jump to the end of a 65,536-worker recording applies one copy per gap, not one per beat."""
        t, _, before, until = heapq.heappop(self._due)
        hb = self.heartbeat_s
        last = t + int((min(ts, until) - t) / hb) * hb
        t = max(t, last - hb if last >= until else last)
        if t + hb < until:
            heapq.heappush(self._due, (t + hb, next(self._n), before, until))
        return _copy_at(before, t)
