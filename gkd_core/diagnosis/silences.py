"""Who is silent, found without a walk over every worker: ``heartbeat_stale``'s index.

Each worker waits in a wheel of slots until its deadline: the moment it would be silent for
``Limits.shortest(LATE)`` (``liveness``) were nothing more heard of it. A pass reads those whose deadline came due
and those the reducer fed (a new phase, relay or pid, an end: ``state.feed``); one heard from since goes back at
its new deadline, one silent joins the silent, whom every pass judges again (few, unless the run is in trouble).
A heartbeat moves nobody in the wheel: a deadline is a lower bound of the silence, read again when it comes.

A worker of a relay's roster (``views.heartbeat_at``: the relay's clock vouches for it) waits on its relay: it
is heard from no earlier than the relay's clock or the end of the relay's word for it (``vouch_s`` past its own
newest full beat, which comes every ``FULL_BEAT_S``), so the relay's slot comes due when its clock would be that
old (only a relay gone quiet has its workers read), and its own slot when that word runs out. A new phase of such
a worker (a step's, for every worker at once) moves it nowhere. So at 131,072 workers on 16,384 nodes a pass
reads the relays that came due and the few workers that did, and a pass over a state where nothing changed and
nothing came due reads none.
"""

from __future__ import annotations

import heapq
import math

from gkd_core.state import RunState, WorkerState
from gkd_core.state.feed import Feed
from gkd_core.state.liveness import FROZEN, LATE, Judged, Limits, others_heard, silence
from gkd_core.state.views import heard_from
from gkd_core.vocab import WORKER_ENDED

SLOT_S = 0.25  # a slot of the wheel: deadlines within it come due together (each still read against its own)


class SilenceWatch:
    """The workers of one state that may be silent, kept between passes (``state.kept``)."""

    def __init__(self, state: RunState) -> None:
        self._feed: Feed = state.feed()
        self._made_with: tuple[float, float] | None = None  # (the silence, vouch_s) the deadlines are of
        self._slots: dict[int, list[tuple[float, str]]] = {}  # slot -> (deadline, worker or "@relay")
        self._heap: list[int] = []  # the slots that hold entries
        self._due: dict[str, float] = {}  # worker or "@relay" -> its deadline (an entry of another is stale)
        self._relay_of: dict[str, str] = {}  # worker -> the relay whose clock it waits on
        self._vouched: dict[str, set[str]] = {}  # relay -> the workers that wait on its clock
        self.silent: dict[str, int] = {}  # the workers found silent -> their place (judged again every pass)
        self._place: dict[str, int] = {}  # worker -> its place in the state (the findings' order)
        self.read = 0  # workers read since made (a test counts what a pass costs)

    def silent_now(self, state: RunState, now: float, limits: Limits) -> list[tuple[WorkerState, Judged]]:
        """What ``liveness.silent_among(state, state.workers.values(), now, limits)`` says (the workers not ended
        that are late or frozen, in the state's order), from what changed and what came due."""
        after = limits.shortest(LATE)
        changed = self._feed.take()
        if changed is None or self._made_with != (after, state.vouch_s):
            self._anew((after, state.vouch_s))
            changed = state.workers
        self._take_in(state, changed, now, after)
        self._come_due(state, now, after)
        others = others_heard(state, now, limits)
        found = []
        for src in sorted(self.silent, key=self.silent.__getitem__):
            self.read += 1
            was = state.workers.get(src)
            if was is None:
                del self.silent[src]
                continue
            judged = silence(state, was, now, limits, others) if was.phase not in WORKER_ENDED else None
            if judged is not None and judged.word in (LATE, FROZEN):
                found.append((was, judged))
            else:
                del self.silent[src]
                self._file(state, was, now, after)
        return found

    def keep_up(self, state: RunState, now: float, most: int) -> None:
        """Take in ``most`` of the workers fed since the last pass now, between passes (``diagnosis.keep_up``): after
        a burst (131,072 workers' first beats) the pass finds little left to read."""
        if self._made_with is None or self._made_with[1] != state.vouch_s:
            return  # (made anew at the next pass)
        changed = self._feed.take(most)
        if changed is None:
            self._made_with = None  # (the feed overflowed: everything again, at the next pass)
            return
        self._take_in(state, changed, now, self._made_with[0])

    def _take_in(self, state: RunState, changed: dict[str, WorkerState], now: float, after: float) -> None:
        place, relay_of, due, vouch = self._place, self._relay_of, self._due, state.vouch_s
        for src, w in changed.items():
            if src not in place:
                place[src] = len(place)
            elif (w.clock_via and relay_of.get(src) == w.clock_via and w.phase not in WORKER_ENDED
                  and due.get(src, math.inf) <= max(w.last_heartbeat + vouch, w.phase_since) + after):
                continue  # a new phase of a worker its relay vouches for (a step's 131,072): it waits as it did
            self._file(state, w, now, after)

    def _anew(self, made_with: tuple[float, float]) -> None:
        place = self._place  # (everything as new but the feed and the places)
        self._slots, self._heap, self._due, self._relay_of, self._vouched, self.silent = {}, [], {}, {}, {}, {}
        self._place, self._made_with = place, made_with

    def _file(self, state: RunState, w: WorkerState, now: float, after: float) -> None:
        """Where ``w`` waits from now on: among the silent, on its relay's clock, or in the wheel."""
        src = w.src
        self.read += 1
        relay = self._relay_of.pop(src, None)
        if relay is not None:
            self._vouched[relay].discard(src)
        self._due.pop(src, None)
        if w.phase in WORKER_ENDED:
            self.silent.pop(src, None)
            return  # (fed again when it starts anew)
        beat = w.last_heartbeat
        if not beat:  # never heard from: alive (its first beat is fed)
            self.silent.pop(src, None)
            return
        heard = heard_from(state, w)
        if now - heard > after:
            self.silent[src] = self._place[src]
            return
        self.silent.pop(src, None)
        clock = state.relay_clocks.get(w.clock_via) if w.clock_via else None
        vouched_until = beat + state.vouch_s
        if clock is not None and clock[1] < vouched_until and now - clock[1] < after:
            # its relay's clock says it (it is heard from no earlier than the clock, or the end of the relay's word
            # for it: its own beat is newer while the clock is not): it waits on the relay, and on that end
            self._relay_of[src] = w.clock_via
            members = self._vouched.setdefault(w.clock_via, set())
            members.add(src)
            if "@" + w.clock_via not in self._due:
                self._slot("@" + w.clock_via, clock[1] + after)
            self._slot(src, max(vouched_until, w.phase_since) + after)
        else:
            self._slot(src, heard + after)

    def _slot(self, name: str, deadline: float) -> None:
        """``name`` waits until ``deadline`` (never before the pass's ``now``: nothing filed is due at once)."""
        at = deadline / SLOT_S
        if not math.isfinite(at):
            return  # (a sender's absurd clock: heard from at the end of time, never silent)
        self._due[name] = deadline
        k = math.floor(at)
        entries = self._slots.get(k)
        if entries is None:
            entries = self._slots[k] = []
            heapq.heappush(self._heap, k)
        entries.append((deadline, name))

    def _come_due(self, state: RunState, now: float, after: float) -> None:
        """Read the entries whose deadline came: a relay whose clock is old has its workers read."""
        heap, slots, due = self._heap, self._slots, self._due
        later: list[tuple[float, str]] = []  # in a slot come due, but not due yet themselves
        while heap and heap[0] * SLOT_S <= now:
            for deadline, name in slots.pop(heapq.heappop(heap)):
                if due.get(name) != deadline:
                    continue  # filed again since
                if deadline >= now:  # (silent only past it: at it, it would be filed at it again)
                    later.append((deadline, name))
                    continue
                del due[name]
                if name.startswith("@"):
                    self._relay_due(state, name[1:], now, after)
                elif (w := state.workers.get(name)) is not None:
                    self._file(state, w, now, after)
        for deadline, name in later:
            self._slot(name, deadline)

    def _relay_due(self, state: RunState, relay: str, now: float, after: float) -> None:
        clock = state.relay_clocks.get(relay)
        members = self._vouched.get(relay)
        if not members:
            self._vouched.pop(relay, None)
            return
        if clock is not None and now - clock[1] <= after:
            self._slot("@" + relay, clock[1] + after)
            return
        del self._vouched[relay]
        for src in members:
            self._relay_of.pop(src, None)
            w = state.workers.get(src)
            if w is not None:
                self._file(state, w, now, after)


def silent_workers(state: RunState, now: float, limits: Limits) -> list[tuple[WorkerState, Judged]]:
    """The workers of ``state`` not ended that are late or frozen at ``now``, from its watch (kept between calls)."""
    return state.kept("silences", lambda: SilenceWatch(state)).silent_now(state, now, limits)
