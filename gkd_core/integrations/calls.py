"""The calls a watched process is in, as its Activity keeps them (activity): a ``Call`` each, the tracked
methods' calls by thread (``Lanes``: a tuple a call, made Calls by the watcher), and the ones that ended
too briefly to be shown (``Brief``: the newest few, within a budget of events a second); and which of those in
flight the watcher shows as the process's phase (``view_of``)."""

from __future__ import annotations

import asyncio
import collections
import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from gkd_core.telemetry import events as ev

get_ident = threading.get_ident  # (read at each call: one lookup fewer)
# (task, lane, method) of the async actor call that a task runs: set as the call begins, in its own task (Ray
# runs each call of an async actor as a task of its own), so that what it does inside (a request it sends, a
# queue it waits on) is in its lane. A task started from inside it copies the value, and is told apart by it.
_async_call: contextvars.ContextVar[tuple[Any, Any, str] | None] = contextvars.ContextVar("gkd_async_call",
                                                                                          default=None)


QUEUE_KINDS = ("queue.Queue", "asyncio.Queue")  # the waits on data that are a consumer's, on its queue


def data_wait(kind: str) -> str:
    """The name of a wait on data of ``kind`` as a call (``queue.Queue wait``, ``asyncio.Condition wait``)."""
    return f"{kind} wait"


def waits_at(call: Call) -> str:
    """Where a call waits on data: ``queue`` (a consumer's get), ``gate`` (an Event, a Condition), or ""
    when it is no wait on data."""
    if not call.wait or not call.name.endswith(" wait"):
        return ""
    return "queue" if call.name.removesuffix(" wait") in QUEUE_KINDS else "gate"


def entered_async(lane: Any, name: str) -> None:
    """An async actor's call ``name`` begins in the running task, in ``lane`` (its coroutine)."""
    _async_call.set((asyncio.current_task(), lane, name))


def running_async() -> tuple[Any, str] | None:
    """(lane, call) of what runs here on an event loop: an async actor's call (its coroutine, its method),
    else the task itself with no call (a server's handler, a task the job made); None off any loop."""
    loop = asyncio._get_running_loop()  # (None off a loop: current_task's RuntimeError costs a raise a wait)
    task = asyncio.current_task(loop) if loop is not None else None
    if task is None:
        return None
    held = _async_call.get()
    if held is not None and held[0] is task:
        return held[1], held[2]
    return task, ""


class Call:
    """A call in flight: an async actor's method (``Activity.enter_call``), or a tracked method's that the
    watcher made of its lane's tuple (``Lanes``); a wait or a framework's phase is a ``DetailedCall``, with a
    detail, a deadline, a progress."""

    __slots__ = ("name", "number", "lane", "step", "started", "ended", "shown")
    detail: str = ""
    deadline: float | None = None
    progress: Callable[[], str] | None = None  # asked from the watcher's thread: what the call has left to do
    wait = False  # a wait (ray.get) inside a phase: shown as that phase, with what it waits for
    waits_on: Callable[[], list[str]] | None = None  # the calls a wait has not had answered yet (``Worker.method``)

    def __init__(self, name: str, number: int, lane: Any, step: int | None = None):
        self.name, self.number, self.step = name, number, step
        self.lane = lane  # what runs it: its thread's ident, or the coroutine of an asyncio call (whose stack it is)
        self.started = time.time()
        self.ended: float | None = None
        self.shown = False

    @property
    def is_async(self) -> bool:
        return not isinstance(self.lane, int)


class DetailedCall(Call):
    __slots__ = ("detail", "deadline", "progress", "wait", "waits_on")

    def __init__(self, name: str, number: int, lane: Any, step: int | None, detail: str, deadline: float | None,
                 progress: Callable[[], str] | None, wait: bool, waits_on: Callable[[], list[str]] | None):
        super().__init__(name, number, lane, step)
        self.detail, self.deadline, self.progress, self.wait, self.waits_on = detail, deadline, progress, wait, waits_on


class Lane:
    """A thread's method calls, as ``Lanes.tracked`` notes them at the least cost: the one it runs now,
    ``(name, number, started)``, and the newest that ended, ``((name, number, started), ended)``."""

    __slots__ = ("running", "ended")

    def __init__(self):
        self.running: tuple[str, int, float] | None = None
        self.ended: tuple[tuple[str, int, float], float] | None = None


class Wakes(Protocol):
    """What a tracked call wakes, as it begins: the watcher, asleep or not started yet (an Activity)."""

    asleep: bool
    started: bool

    def wake(self) -> None: ...


class Lanes:
    """The tracked methods' calls of one process, by thread: written by the job's threads at the least cost
    (``tracked``), made Calls by the watcher once a tick (``take``): the same Call while one runs (the phase
    shown keeps its identity), and each that ended, with its end, to the brief calls."""

    def __init__(self):
        self._lanes: dict[int, Lane] = {}  # by thread ident
        # the watcher's own: the Call it made of each lane's newest call it saw running, with the tuple it was
        # made of; and the newest ended tuple it took
        self._made: dict[int, tuple[tuple, Call]] = {}
        self._taken: dict[int, tuple[tuple[str, int, float], float]] = {}
        self.running: list[Call] = []  # as of the last take
        self.newest_start = 0.0  # (time.time) of the newest call taken

    def tracked(self, name: str, executor: Callable[..., Any], counts: dict[str, int],
                watcher: Wakes) -> Callable[..., Any]:
        """``executor`` (an actor's method, Ray's executor of it) made a call of this process's at the least cost
        there is: a job of tiny calls runs thousands a second, each on a cache that Ray's own work between two
        of them has emptied (bench/bench_ray_watch.py times it in place). One frame, a count, two tuples and
        two clock reads: its thread's Lane holds the call it runs and the newest that ended; ``counts``: the
        calls of each name so far, the Activity's (a call's number counts them all)."""
        lanes, wall = self._lanes, time.time

        def run(*args, **kwargs):
            lane = lanes.get(get_ident())
            if lane is None:
                lane = lanes[get_ident()] = Lane()
            number = counts[name] = counts.get(name, 0) + 1
            running = lane.running = (name, number, wall())  # (a thread runs one method at a time)
            if watcher.asleep or not watcher.started:
                watcher.wake()
            try:
                return executor(*args, **kwargs)
            finally:
                lane.ended = (running, wall())  # before it stops running: never seen gone and unended
                lane.running = None

        return run

    def take(self) -> list[Call]:
        """The lanes' calls as Calls: each running one in ``running``; returns those that ended since the last
        take, with their ends (of each lane, the one that ran then and the newest since)."""
        running_now: list[Call] = []
        ended_now: list[Call] = []
        for ident, lane in list(self._lanes.items()):
            running, ended = lane.running, lane.ended  # (in this order: the thread sets them in the other)
            if running is not None and ended is not None and ended[0][2] >= running[2]:
                running = None  # it ended after the first read (and perhaps a newer one too)
            new_end = ended is not None and ended is not self._taken.get(ident)
            if ended is not None:
                self._taken[ident] = ended
            held = self._made.get(ident)
            if held is not None and held[0] is not running:  # the call made of one that ran is over
                call = held[1]
                if ended is not None and ended[0] is held[0]:
                    call.ended, new_end = ended[1], False
                else:  # newer calls ran since: it ended before the first of them began
                    later = [t[2] for t in (running, ended[0] if ended is not None else None) if t is not None]
                    call.ended = min(later, default=time.time())
                ended_now.append(call)
                del self._made[ident]
                held = None
            if new_end:
                assert ended is not None  # (a new end is one)
                (name, number, started), end = ended
                call = Call(name, number, ident)
                call.started, call.ended = started, end
                ended_now.append(call)
                self.newest_start = max(self.newest_start, started)
            if running is not None:
                if held is None:
                    call = Call(running[0], running[1], ident)
                    call.started = running[2]
                    held = self._made[ident] = (running, call)
                    self.newest_start = max(self.newest_start, running[2])
                running_now.append(held[1])
        self.running = running_now
        return ended_now

    def here(self) -> tuple[int, str, object] | None:
        """(this thread's ident, the tracked method it runs now, that call's own note of it), if it runs one."""
        ident = get_ident()
        lane = self._lanes.get(ident)
        running = lane.running if lane is not None else None
        return (ident, running[0], running) if running is not None else None

    def busy(self) -> bool:
        """Whether a call runs, or one ended that the last take did not see (a look before the watcher sleeps)."""
        return any(lane.running is not None or (lane.ended is not None and lane.ended is not self._taken.get(ident))
                   for ident, lane in list(self._lanes.items()))


class Brief:
    """Calls that ended, perhaps never shown: the newest ``keep`` (a tick reads them all, and a job of tiny
    calls ends hundreds between two ticks), of which at most ``per_s`` a second is sent (a bucket that holds
    ``burst``): a peer's 5 ms sync is what its stuck peer is measured against, and a flood is sampled."""

    def __init__(self, per_s: float, burst: int, keep: int):
        self.per_s, self.burst = per_s, burst
        self._calls: collections.deque[Call] = collections.deque(maxlen=keep)
        self._budget, self._budget_at = float(burst), time.monotonic()

    def __bool__(self) -> bool:
        return bool(self._calls)

    def append(self, call: Call) -> None:
        self._calls.append(call)

    def clear(self) -> None:
        self._calls.clear()

    def due(self, since: float | None, until: float, active: list[Call]) -> list[tuple[Call, float]]:
        """Those to send now, with their ends: begun after ``since``, ended by ``until`` while none of
        ``active`` was under way, never shown; the newest the budget allows. The rest are dropped."""
        mono = time.monotonic()
        self._budget = min(float(self.burst), self._budget + (mono - self._budget_at) * self.per_s)
        self._budget_at = mono
        if self._budget < 1:  # none may go now: the next that may will be newer than these
            self._calls.clear()
            return []
        ended: list[Call] = []
        while self._calls:  # taken one by one: the job's threads append meanwhile (a deque is not to be
            ended.append(self._calls.popleft())  # iterated while another thread appends to it)
        brief = [(c, c.ended) for c in ended if not c.shown and (since is None or c.started >= since)
                 and c.ended is not None and c.ended <= until and not any(a.started < c.started for a in active)]
        sent = brief[len(brief) - min(len(brief), int(self._budget)):]
        self._budget -= len(sent)
        return sent

    def send(self, emit: Callable[[ev.Event], None], since: float | None, until: float,
             active: list[Call]) -> float | None:
        """Those ``due`` now, as phases after the fact (their start, then idle at their end), the newest the
        budget allows (BRIEF_PER_S). Returns the end of the last one sent (else ``since``)."""
        for call, end in self.due(since, until, active):
            call.shown = True
            emit(ev.PhaseEvent(phase=call.name, started=call.started, step=call.step,
                               call=None if call.step is not None else call.number, detail=call.detail[:300],
                               ts=call.started))
            emit(ev.PhaseEvent(phase="idle", started=end, ts=end))
            since = end
        return since


class View(NamedTuple):
    """What the watcher shows: the phase, the call whose detail it shows (a wait inside it), and the calls
    in flight at once (their lanes' outermost calls, oldest first; one when nothing runs beside the phase)."""

    phase: Call | None
    about: Call | None
    in_flight: list[Call]


NOTHING = View(None, None, [])


def view_of(running: list[Call], now: float, show_after_s: float) -> View:
    """The oldest lane's newest call that has lasted ``show_after_s`` is the phase (a wait inside a phase shows as
    that phase, with the wait's detail), save a lane's on a queue beside one's at a gate; every lane in flight
    is counted."""
    calls = sorted(running, key=lambda c: c.started)
    lanes: dict[Any, list[Call]] = {}
    for c in calls:
        if now - c.started >= show_after_s:
            lanes.setdefault(c.lane, []).append(c)
    if not lanes:
        return NOTHING
    outermost: dict[Any, Call] = {}  # each lane's outermost call, the oldest first: the calls in flight
    for c in calls:
        outermost.setdefault(c.lane, c)
    in_flight = list(outermost.values())
    shown = next(iter(lanes.values()))
    if waits_at(shown[-1]) == "queue":  # a consumer on its queue, beside a call parked at a gate: the gate
        shown = next((lane for lane in lanes.values() if waits_at(lane[-1]) == "gate"), shown)
    newest = shown[-1]
    if newest.wait:
        outer = [c for c in shown[:-1] if not c.wait]
        if outer:
            return View(outer[-1], newest, in_flight)
    return View(newest, newest, in_flight)


def in_flight_said(view: View) -> str:
    """``8 in flight (generate ×8); the oldest #17``: the calls in flight, and which of them is shown."""
    phase, oldest = view.phase, view.in_flight[0]
    assert phase is not None  # (said of a view with a phase)
    mix = collections.Counter(c.name for c in view.in_flight)
    which = (f"the oldest #{phase.number}" if oldest.lane == phase.lane
             else f"{phase.name} #{phase.number} at its gate, beside the oldest ({oldest.name} #{oldest.number}, on "
                  f"its queue)")
    return f"{len(view.in_flight)} in flight ({', '.join(f'{n} ×{k}' for n, k in mix.most_common(4))}); {which}"
