"""How fast each memory scope grows, and who in it: learned by the diagnosis from the state at each pass.

Learned here, not in the state: the live state has every heartbeat and a replay only the log's, so a rate
learned from their sequence would differ between the two; a pass a second reads each scope's newest use,
as the heartbeats said it. A scope's growth is measured window by window (GROWTH_WINDOW_S) and smoothed,
and ``rising_since`` says since when every window grew, so a start-up's climb of a few seconds is not a
leak and a big flat scope never grows. While a scope rises, each worker in it is measured from its RSS when
the rise began (or it was first seen in it): who grew is who to name. A pass reads the scopes with a new
reading (``state.scope_feed``) and the workers that came into a scope or left one (``state.feed``), and then
the rising scopes only: nothing, when nothing changed."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from gkd_core.state import RunState
from gkd_core.state.memory_cases import scope_key

GROWTH_WINDOW_S = 3.0
RISING = 1 << 20  # bytes a second over a window: growing (less is noise: a cache, an allocator's breath)


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
    # while it rises: each worker's (ts, rss) at the rise's start, to measure who grew
    baseline: dict[str, tuple[float, int]] = field(default_factory=dict)
    # whether its members had their baseline (one that comes into it later gets its own then)
    measured: bool = False


class GrowthIndex:
    """Each scope's growth and who is in it, kept between passes (``state.kept``)."""

    def __init__(self, state: RunState):
        self.scopes: dict[str, ScopeGrowth] = {}
        self.rising: dict[str, int] = {}  # the scopes rising now -> their place in the state (the findings' order)
        self.lock = threading.Lock()
        self._scope_feed = state.scope_feed()
        self._worker_feed = state.feed(moves=False)
        self._place: dict[str, int] = {}  # scope -> its place in the state
        self._members: dict[str, set[str]] = {}  # a scope -> the workers whose beats say they are in it
        self._scope_of: dict[str, str] = {}  # a worker -> its scope
        self._joined: set[str] = set()  # the scopes a worker came into since the last pass
        self._read_all = True

    def keep_up(self, state: RunState, most: int) -> None:
        """Take in ``most`` of the workers fed since the last pass now, between passes (``diagnosis.keep_up``)."""
        if self._read_all:
            return  # (read at the first pass)
        workers = self._worker_feed.take(most)
        if workers is None:
            self._read_all = True  # (the feed overflowed: everything again, at the next pass)
            return
        for src, w in workers.items():
            self._file(src, scope_key(w.node, w.mem.scope) if w.mem is not None else None)

    def observe(self, state: RunState) -> None:
        scopes, workers = self._scope_feed.take(), self._worker_feed.take()
        if self._read_all or workers is None:
            if self._read_all:  # (and the scopes it knows: one gone since is let go below)
                scopes, self._read_all = scopes | set(state.mem_scopes) | set(self.scopes), False
                self._place = {key: i for i, key in enumerate(state.mem_scopes)}
            self._members, self._scope_of = {}, {}
            workers = state.workers
        for src, w in workers.items():
            self._file(src, scope_key(w.node, w.mem.scope) if w.mem is not None else None)
        for key in scopes:
            s = state.mem_scopes.get(key)
            if s is None:  # (let go: the oldest of too many)
                self.scopes.pop(key, None)
                self.rising.pop(key, None)
                self._place.pop(key, None)
                continue
            place = self._place.setdefault(key, len(self._place))
            got = self.scopes.get(key)
            if got is None:
                self.scopes[key] = ScopeGrowth(Growth(s.ts, s.used))
                continue
            got.growth.add(s.ts, s.used)
            if got.growth.rising_since is None:
                got.baseline, got.measured = {}, False
                self.rising.pop(key, None)
            else:
                self.rising[key] = place
        for key in self.rising:
            # each worker of the scope from when it is first seen in the rise (one may come into it after it began)
            got = self.scopes[key]
            if got.measured and key not in self._joined:
                continue
            base = got.baseline
            for src in self._members.get(key, ()):
                member = state.workers.get(src)
                if src not in base and member is not None:
                    base[src] = (member.last_heartbeat, member.rss)
            got.measured = True
        self._joined.clear()

    def _file(self, src: str, key: str | None) -> None:
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
            self._joined.add(key)

    def growers(self, state: RunState, key: str) -> list[tuple[float, str]]:
        """(bytes a second since the rise began, worker) of the scope's workers, the fastest first."""
        got = self.scopes.get(key)
        out = []
        for src, (ts0, rss0) in (got.baseline.items() if got is not None else ()):
            w = state.workers.get(src)
            if w is not None and w.last_heartbeat > ts0:
                out.append(((w.rss - rss0) / (w.last_heartbeat - ts0), src))
        return sorted(out, reverse=True)


def index_of(state: RunState) -> GrowthIndex:
    """The state's growth index, for as long as the state lives (``observe`` brings it up to date with it)."""
    return state.kept("growth", lambda: GrowthIndex(state))
