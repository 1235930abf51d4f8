"""How fast each memory scope grows, and who in it: learned by the diagnosis from the state at each pass.

Learned here, not in the state: the live state has every heartbeat and a replay only the log's, so a rate
learned from their sequence would differ between the two; a pass a second reads each scope's newest use,
as the heartbeats said it. A scope's growth is measured window by window (GROWTH_WINDOW_S) and smoothed,
and ``rising_since`` says since when every window grew, so a start-up's climb of a few seconds is not a
leak and a big flat scope never grows. While a scope rises, each worker in it is measured from its RSS when
the rise began (or it was first seen in it): who grew is who to name. O(scopes) a pass, and O(workers) a
pass when workers came or went, or once in MEMBERS_AGAIN_S, while a scope rises.
"""

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
    # the scope's members, as listed when each had a baseline, and how many they were (a worker read later
    # is added to the same list)
    measured: tuple[list[str], int] | None = None


MEMBERS_AGAIN_S = 30.0  # who is in which scope is listed again this often (and whenever workers come or go)


class GrowthIndex:
    def __init__(self):
        self.scopes: dict[str, ScopeGrowth] = {}
        self.lock = threading.Lock()
        self._members: dict[str, list[str]] = {}  # a scope -> the workers whose beats say they are in it
        self._unread: list[str] = []  # workers that had no memory reading when they were listed
        self._listed = (-1, 0.0)  # (how many workers, the state's time) when they were listed
        self._sought: set[str] = set()  # scopes that rose with no worker listed in them, listed again for once

    def observe(self, state: RunState) -> None:
        members = None
        for key, s in state.mem_scopes.items():
            got = self.scopes.get(key)
            if got is None:
                self.scopes[key] = ScopeGrowth(Growth(s.ts, s.used))
                continue
            got.growth.add(s.ts, s.used)
            if got.growth.rising_since is None:
                got.baseline, got.measured = {}, None
                continue
            # each worker of the scope from when it is first seen in the rise (one may start after it began);
            # once all have one, again only when they are listed again
            members = self._members_of(state) if members is None else members
            listed = members.get(key)
            if listed is None and key not in self._sought:  # a scope new since the listing: a worker moved into it
                self._sought.add(key)
                members = self._members_of(state, again=True)
                listed = members.get(key)
            if listed is None or (got.measured is not None and got.measured[0] is listed
                                  and got.measured[1] == len(listed)):
                continue
            base = got.baseline
            for src in listed:
                w = state.workers.get(src)
                if src not in base and w is not None:
                    base[src] = (w.last_heartbeat, w.rss)
            got.measured = (listed, len(listed))
        for key in [k for k in self.scopes if k not in state.mem_scopes]:
            del self.scopes[key]
            self._sought.discard(key)

    def _members_of(self, state: RunState, again: bool = False) -> dict[str, list[str]]:
        """Each scope's workers: one walk over them all (8,192 nodes' scopes can rise at once), again only when
        workers came or went, every MEMBERS_AGAIN_S, or (``again``) when a scope rises that none is listed in: a
        worker moved into another cgroup (a job put in its own, a container's), whose growth is then seen at once,
        not up to MEMBERS_AGAIN_S later."""
        count, at = self._listed
        if again or count != len(state.workers) or not 0 <= state.last_ts - at < MEMBERS_AGAIN_S:
            self._members, self._unread = {}, []
            for w in state.workers.values():
                if w.mem is not None:
                    self._members.setdefault(scope_key(w.node, w.mem.scope), []).append(w.src)
                else:
                    self._unread.append(w.src)
            self._listed = (len(state.workers), state.last_ts)
        elif self._unread:  # (registered before their first beat: read since?)
            unread = []
            for src in self._unread:
                now_read = state.workers.get(src)
                if now_read is not None and now_read.mem is not None:
                    self._members.setdefault(scope_key(now_read.node, now_read.mem.scope), []).append(src)
                elif now_read is not None:
                    unread.append(src)
            self._unread = unread
        return self._members

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
    return state.kept("growth", GrowthIndex)
