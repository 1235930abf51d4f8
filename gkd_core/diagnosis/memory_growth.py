"""How fast each memory scope grows, and who in it: learned by the diagnosis from the state, reading by reading.

Learned here, not in the state: the live state has every heartbeat and a replay only the log's, so a rate
learned from their sequence would differ between the two; the diagnosis reads each scope's newest use, as the
heartbeats said it. A scope's growth is measured window by window (GROWTH_WINDOW_S) and smoothed, and
``rising_since`` says since when every window grew, so a start-up's climb of a few seconds is not a leak and a big
flat scope never grows. The index looks at a scope's reading when its window can end (``LOOK_LATE_S`` after, by the
heartbeats' clock), not at every reading: a node's comes every second, 16,384 of them a second at the largest, and
all but one a window would be a look and no more. While a scope rises, each worker in it is measured from its RSS
when the rise was found (or it came into the scope): who grew is who to name. The index is fed the scopes made and
let go (``state.scope_feed``) and the workers that came into a scope or left one (``state.feed``), looks at the
scopes due, at its passes and in slices between them (``keep_up``), and the rule reads the rising scopes near their
limit only: nothing, when nothing changed."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from gkd_core.state import RunState, WorkerState
from gkd_core.state.memory_cases import scope_key
from gkd_core.state.records import ScopeMemory

GROWTH_WINDOW_S = 3.0
RISING = 1 << 20  # bytes a second over a window: growing (less is noise: a cache, an allocator's breath)
# a scope is looked at this long after its window can end, by the newest heartbeat's clock: a heartbeat period, so
# that the reading that ends it has come wherever in the period its node reports (a window is 3 to 4 s); one not
# come by then (a node gone quiet) is looked at again as long after
LOOK_LATE_S = 1.0
LOOK_QUIET_MAX_S = 30.0  # a quiet scope's next look waits as long as it has been quiet, up to this
# scopes a pass looks at, at the most: after a stall (a mass silence judged) thousands fall due at once, and the pass
# would read them all; the rest are looked at in the ticks after it (``keep_up``), a window being seconds long
PASS_LOOKS = 512


@dataclass
class Growth:
    anchor_ts: float  # the reading the current window is measured from
    anchor: int
    rate: float = 0.0  # bytes a second, smoothed
    rising_since: float | None = None  # since when every window grew (None: the last did not)

    def add(self, ts: float, value: int) -> None:
        dt = ts - self.anchor_ts
        if dt < GROWTH_WINDOW_S:
            if dt < 0:  # a clock that went back: measured from here
                self.anchor_ts, self.anchor = ts, value
            return
        now = (value - self.anchor) / dt
        if now < RISING:
            self.rising_since = None
        elif self.rising_since is None:
            self.rising_since = self.anchor_ts
        self.rate = now if self.rate == 0.0 else 0.5 * (self.rate + now)
        self.anchor_ts, self.anchor = ts, value


@dataclass
class ScopeGrowth:
    growth: Growth
    look_at: float = 0.0  # when it is next looked at (the index's ``_due`` holds it then)
    # while it rises: each worker's (ts, rss) at the rise's start (or when it came into the scope), to measure who
    # grew: taken as the rise is found, and as a worker comes in
    baseline: dict[str, tuple[float, int]] = field(default_factory=dict)


class GrowthIndex:
    """Each scope's growth and who is in it, kept between passes (``state.kept``)."""

    def __init__(self, state: RunState, near: Callable[[ScopeMemory, Growth], bool] = lambda s, g: True):
        self.scopes: dict[str, ScopeGrowth] = {}
        self.rising: dict[str, int] = {}  # the scopes rising now -> their place in the state (the findings' order)
        # ... those of them near their limit at their rate, as the rule says it (``near``), judged at each window's
        # end: what the rule reads, of thousands of nodes whose memory rises and falls by a few MB a second
        self.near: dict[str, int] = {}
        self._near = near
        self.lock = threading.Lock()
        self._scope_feed = state.scope_feed(made_only=True)
        self._worker_feed = state.feed(moves=False)
        self._due: list[tuple[float, str]] = []  # a heap: (when to look at it, by the heartbeats' clock; scope)
        self._place: dict[str, int] = {}  # scope -> its place in the state
        self._places = itertools.count()  # (a new scope's)
        self._members: dict[str, set[str]] = {}  # a scope -> the workers whose beats say they are in it
        self._scope_of: dict[str, str] = {}  # a worker -> its scope
        self._read_all = True
        self.looked = 0  # readings looked at, in all (a test's count)

    def keep_up(self, state: RunState, most: int) -> None:
        """Take in ``most`` of the workers and scopes fed since the last pass, and look at ``most`` of the scopes due,
        between passes (``diagnosis.keep_up``)."""
        if self._read_all:
            return  # (read at the first pass)
        workers = self._worker_feed.take(most)
        if workers is None:
            self._read_all = True  # (the feed overflowed: everything again, at the next pass)
            return
        for w in workers.values():
            self._file(w)
        self._made_or_gone(state, self._scope_feed.take(most))
        self._look(state, most)

    def observe(self, state: RunState) -> None:
        scopes, workers = self._scope_feed.take(), self._worker_feed.take()
        if self._read_all or workers is None:
            if self._read_all:  # (and the scopes it knows: one gone since is let go below)
                scopes, self._read_all = scopes | set(state.mem_scopes) | set(self.scopes), False
                self._place = {key: i for i, key in enumerate(state.mem_scopes)}
                self._places = itertools.count(len(self._place))
            self._members, self._scope_of = {}, {}
            workers = state.workers
        for w in workers.values():
            self._file(w)
        self._made_or_gone(state, scopes)
        self._look(state, PASS_LOOKS)

    def _made_or_gone(self, state: RunState, scopes: set[str]) -> None:
        """Scopes the state made (their first reading: a window's anchor) or let go (the oldest of too many)."""
        scopes_now = state.mem_scopes
        for key in scopes:
            s = scopes_now.get(key)
            if s is None:
                self.scopes.pop(key, None)
                self.rising.pop(key, None)
                self.near.pop(key, None)
                self._place.pop(key, None)
            elif key not in self.scopes:
                if key not in self._place:
                    self._place[key] = next(self._places)
                self.scopes[key] = got = ScopeGrowth(Growth(s.ts, s.used))
                self._look_again(got, key, s.ts + GROWTH_WINDOW_S + LOOK_LATE_S)

    def _look_again(self, got: ScopeGrowth, key: str, at: float) -> None:
        got.look_at = at
        heapq.heappush(self._due, (at, key))

    def _look(self, state: RunState, most: int | None = None) -> None:
        """The scopes due by the newest heartbeat (``most`` of them: the rest at the next), each at its newest
        reading: a window ends at a reading ``GROWTH_WINDOW_S`` or more past its anchor (one that has not come is
        looked for again ``LOOK_LATE_S`` later, or as long as the scope has been quiet: 16,384 nodes gone quiet
        together are not looked at every second). Whether a rising scope is near its limit is judged again at each
        window's end, from its use then (the rule reads its use now)."""
        due, clock, scopes_now, looked = self._due, state.newest_beat, state.mem_scopes, 0
        again: list[tuple[ScopeGrowth, str, float]] = []  # (each looked at once a call, whatever the clocks say)
        while due and due[0][0] <= clock and (most is None or looked < most):
            at, key = heapq.heappop(due)
            got = self.scopes.get(key)
            s = scopes_now.get(key)
            if got is None or s is None or got.look_at != at:
                continue  # (let go, or looked at again since: a later entry holds it)
            looked += 1
            self.looked += 1
            if 0.0 <= s.ts - got.growth.anchor_ts < GROWTH_WINDOW_S:
                quiet = min(clock - s.ts, LOOK_QUIET_MAX_S)  # (its reading that ends the window has not come)
                again.append((got, key, clock + max(LOOK_LATE_S, quiet)))
                continue
            self._window_ended(state, key, s, got)
            again.append((got, key, got.growth.anchor_ts + GROWTH_WINDOW_S + LOOK_LATE_S))
        for got, key, at in again:
            self._look_again(got, key, at)

    def _window_ended(self, state: RunState, key: str, s: ScopeMemory, got: ScopeGrowth) -> None:
        got.growth.add(s.ts, s.used)
        if got.growth.rising_since is None:
            got.baseline.clear()  # (not a new dict: half of 16,384 nodes' memories rise by noise in any window)
            self.rising.pop(key, None)
            self.near.pop(key, None)
            return
        place = self._place[key]
        if key not in self.rising:  # a rise found: each worker in the scope is measured from here
            for src in self._members.get(key, ()):
                if (member := state.workers.get(src)) is not None:
                    got.baseline.setdefault(src, (member.last_heartbeat, member.rss))
        self.rising[key] = place
        if self._near(s, got.growth):
            self.near[key] = place
        else:
            self.near.pop(key, None)

    def _file(self, w: WorkerState) -> None:
        """Which scope ``w`` is in (one that comes into a rising scope is measured from then)."""
        src, key = w.src, scope_key(w.node, w.mem.scope) if w.mem is not None else None
        was = self._scope_of.get(src)
        if was == key:
            return
        if was is not None:
            self._members[was].discard(src)
        if key is None:
            self._scope_of.pop(src, None)
        else:
            self._scope_of[src] = key
            self._members.setdefault(key, set()).add(src)
            if key in self.rising:
                self.scopes[key].baseline.setdefault(src, (w.last_heartbeat, w.rss))

    def growers(self, state: RunState, key: str) -> list[tuple[float, str]]:
        """(bytes a second since the rise began, worker) of the scope's workers, the fastest first."""
        got = self.scopes.get(key)
        out = []
        for src, (ts0, rss0) in (got.baseline.items() if got is not None else ()):
            w = state.workers.get(src)
            if w is not None and w.last_heartbeat > ts0:
                out.append(((w.rss - rss0) / (w.last_heartbeat - ts0), src))
        return sorted(out, reverse=True)


def index_of(state: RunState, near: Callable[[ScopeMemory, Growth], bool]) -> GrowthIndex:
    """The state's growth index, for as long as the state lives (``observe`` brings it up to date with it)."""
    return state.kept("growth", lambda: GrowthIndex(state, near))
