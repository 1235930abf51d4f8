"""What one process of a watched job is doing: the calls it is in, shown by a watcher thread.

The wrappers around the job's code only note what they must, a few microseconds a call in a job
(bench/bench_ray_watch.py times them where they run): an actor's method, as a tuple in its thread's
``Lane`` (``tracked``), made a call by the watcher once a tick; a wait on the main thread, as a tuple
(``main_wait``), made a call by the watcher only once it lasts (``make_wait``: whom it waits on); a
framework's phase or an async actor's call, a Call (``enter_call``). A watcher thread, every ``TICK_S``,
shows the newest call
that has lasted at least ``SHOW_AFTER_S`` (of the oldest lane, below) as the process's phase, with its
real start, and the return to ``idle`` with its real end; a call too brief for that is sent after the
fact, the newest of them, at most ``BRIEF_PER_S`` a second (with bursts of ``BRIEF_BURST``). So a job of
a thousand tiny calls a second costs about ten events a second, while a call made once a second is sent
every time; and a call that hangs is on the dashboard 20 to 120 ms after it began (the first tick after it
has lasted 20 ms), with the time it began. The watcher sleeps while its process makes no calls, and a busy
one's ticks cost it a few tenths of a percent of a core (bench/bench_ray_watch.py).

Calls run at once in separate lanes (an async actor's coroutines, a threaded actor's threads); a lane's
calls nest (a method, the ``ray.get`` inside it). With several lanes in flight, the phase shown is the
oldest call's, since its start, with how many are in flight ("8 generate in flight", the oldest #17): a
server whose one request never returns is measured by that request's age, not by the newest one's. Save
one: where the oldest waits on a queue and another call is parked at a gate (an Event, a Condition), the
gate's call is shown. What feeds that queue passes that gate, so the gate is what holds it. slime's rollout
manager, whose producer task parks at its gate by one call while the trainer polls its queue by another, is
then named at its gate whichever of the two began first.
Those asyncio calls' stacks (their ``await`` lines) are written when a capture asks (task_stacks).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gkd_core.integrations.calls import (
    NOTHING,
    Brief,
    Call,
    DetailedCall,
    Lanes,
    View,
    get_ident,
    in_flight_said,
    running_async,
    view_of,
)
from gkd_core.integrations.task_stacks import TaskStackAnswer
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter

TICK_S = 0.1  # (at 0.02, the ticks of a busy process were most of what watching cost it)
SHOW_AFTER_S = 0.02
# a process with no call for this long lets its watcher sleep until the next call begins (its wrapper wakes
# it): an idle actor's watcher then costs nothing, where its ticks were most of what an idle watched
# process spent; a busy one keeps ticking (waking it on every call would cost more)
SLEEP_AFTER_S = 1.0
SLEEP_MAX_S = 1.0  # asleep, it still looks in this often (a close, a reporter to find)
PROGRESS_EVERY_S = 1.0  # how often a shown call's ``progress`` (a wait's answers so far) is asked
# a call that ended before it could be shown is still sent, after the fact, while the process shows
# nothing else, at most this many a second (a bucket that holds BRIEF_BURST): a peer's 5 ms sync is what
# its stuck peer is measured against, and a flood of them is sampled, not sent
BRIEF_PER_S = 5.0
BRIEF_BURST = 5
BRIEF_KEEP = 4 * BRIEF_BURST
PERIODIC_S = 2.0  # how often ``periodic`` is asked
IDENTIFY_EVERY_S = 0.2  # asking who this process is reads Ray's key-value store: not every tick
ASKED_EVERY_S = 0.1  # how often a process with asyncio calls looks for a request for their stacks




class Activity:
    """The calls a process is in. ``enter``/``leave`` from any thread; a thread of its own shows them.

    ``identify`` (called on the watcher's thread until it answers) gives the Reporter once the process
    knows who it is: an actor learns its name from its creator a moment after its ``__init__`` began.
    """

    def __init__(self, identify: Callable[[], Reporter | None]):
        self._identify = identify
        self._active: dict[int, Call] = {}
        self.counts: dict[str, int] = {}  # calls begun since the process began, by name (its ``flow`` says them)
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # (re-entered: starting the watcher waits, and a wait in a call wakes it)
        self._closed = threading.Event()
        self._brief = Brief(BRIEF_PER_S, BRIEF_BURST, BRIEF_KEEP)  # ended, perhaps never shown
        self._task_stacks: TaskStackAnswer | None = None
        self._lanes = Lanes()  # the tracked methods' calls, by thread
        self._last_started = 0.0  # the newest call's start (time.time)
        self.started = False  # its thread (a call's wrapper starts it, the first time)
        self.asleep = False  # the watcher waits on ``_wake`` (set by the next call's ``enter``, or ``wake``)
        self._wake = threading.Event()
        self.reporter: Reporter | None = None
        self.idle_unknown = False  # who it is may never be known (a task worker): asleep with no call, not asking
        self.periodic: Callable[[Reporter], None] | None = None  # asked every PERIODIC_S once it reports
        # the main thread's wait now, as its wrapper noted it: (name, start, what it waits on...), nothing more;
        # one that lasts SHOW_AFTER_S is made a call by the watcher (``make_wait``: its progress, whom it waits
        # on, its deadline, its end), kept in ``waits_made`` by the note's id until the wrapper ends it
        self.main_wait: tuple | None = None
        self.make_wait: Callable[[tuple], Any] | None = None
        self.waits_made: dict[int, tuple[tuple, int, Any]] = {}
        self._unmade: tuple[int, float] | None = None  # (id, start) of a noted wait whose making failed
        self._main = threading.main_thread().ident

    def answer_task_stacks(self, folder: Path) -> None:
        """Offer this process's asyncio calls' stacks to a capture, in ``folder`` (once it has one in flight)."""
        self._task_stacks = TaskStackAnswer(folder)

    def enter(self, name: str, detail: str = "", deadline: float | None = None,
              progress: Callable[[], str] | None = None, step: int | None = None, wait: bool = False,
              waits_on: Callable[[], list[str]] | None = None, lane: Any = None, started: float | None = None) -> int:
        """A call begins; ``step``: the training step it belongs to, where the job says (verl's timers);
        ``wait``: it waits for others (``ray.get``): inside a phase it is that phase's detail, and
        ``waits_on`` (read after each ``progress``) the calls it still waits on, the phase's edges;
        ``lane``: an asyncio call's coroutine (else the calling thread is its lane); ``started``: when it
        began, if before now (a poll's wait, the same as the one before)."""
        number = self.counts.get(name, 0) + 1
        self.counts[name] = number
        token = next(self._ids)
        call = self._active[token] = DetailedCall(name, number, get_ident() if lane is None else lane, step, detail,
                                                  deadline, progress, wait, waits_on)
        call.started = started or call.started
        self._last_started = call.started
        if self.asleep or not self.started:
            self.wake()
        return token

    def enter_call(self, name: str, step: int | None = None, lane: Any = None) -> int:
        """``enter`` for a call of the job's with no detail (an async actor's method, a framework's phase), at
        little cost: such calls can come thousands a second (a sync method's cost least: ``tracked``)."""
        counts = self.counts
        number = counts[name] = counts.get(name, 0) + 1
        token = next(self._ids)
        call = self._active[token] = Call(name, number, get_ident() if lane is None else lane, step)
        self._last_started = call.started
        if self.asleep or not self.started:
            self.wake()
        return token

    def tracked(self, name: str, executor: Callable[..., Any]) -> Callable[..., Any]:
        """``executor`` (an actor's method, Ray's executor of it) as a call of this process's, at the least cost
        there is (``Lanes.tracked``): the watcher makes it a Call once a tick."""
        return self._lanes.tracked(name, executor, self.counts, self)

    def in_flight(self) -> list[Call]:
        """The calls noted with ``enter`` in flight now (a copy: read from any thread)."""
        return list(self._active.values())

    def call_here(self) -> tuple[Any, str, object] | None:
        """(lane, name, mark) of the job's call the running code is part of (an async actor's, a tracked method
        in this thread), ``mark`` an object of that call's alone; None outside any (a thread of Ray's or the
        job's own, a task the job made)."""
        if (running := running_async()) is not None:  # (an async call's lane is its own coroutine: its mark)
            return (running[0], running[1], running[0]) if running[1] else None
        return self._lanes.here()

    def wake(self) -> None:
        """A call began: the watcher, asleep, looks again (started, the first time)."""
        if self.asleep:
            self.asleep = False
            self._wake.set()
        elif not self.started:
            self.start()

    def wait_ended(self, noted: tuple, error: BaseException | None) -> None:
        """The main thread's wait ``noted`` ended (its wrapper calls this only when ``waits_made`` holds any):
        the call the watcher made of it ends."""
        made = self.waits_made.pop(id(noted), None)
        if made is not None and made[0] is noted:
            self.leave(made[1])
            made[2].ended(error)

    def leave(self, token: int) -> None:
        call = self._active.get(token)
        if call is not None:
            call.ended = time.time()  # before it leaves ``_active``: the watcher never sees it gone and unended
            del self._active[token]
            if not call.wait:
                self._brief.append(call)

    def close(self) -> None:
        """Stop watching (the watcher lives as long as the process otherwise)."""
        self._closed.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(1.0)

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="gkd-activity", daemon=True)
                self._thread.start()
                self.started = True

    # --- the watcher's thread -------------------------------------------------------------

    def _view(self, now: float) -> View:
        if not self._active and not self._lanes.running:
            return NOTHING
        return view_of(list(self._active.values()) + self._lanes.running, now, SHOW_AFTER_S)

    def _watch(self) -> None:
        shown = NOTHING
        last_ended: float | None = None  # when the newest call shown (or sent after the fact) ended
        shown_detail = ""
        next_progress = next_identify = next_asked = next_periodic = 0.0
        failed = False
        while True:
            time.sleep(TICK_S)  # (an Event's wait with a timeout costs several times a sleep, at every tick)
            if self._closed.is_set():
                return
            try:
                for call in self._lanes.take():
                    self._brief.append(call)
                self._last_started = max(self._last_started, self._lanes.newest_start)
            except Exception as e:  # a bug of ours: said once; the watcher goes on
                failed = _said_once(failed, e)
            if shown.phase is None and self._may_sleep():
                self._sleep()
                continue
            if self.reporter is None:
                if time.monotonic() < next_identify:
                    continue
                next_identify = time.monotonic() + IDENTIFY_EVERY_S
                try:
                    self.reporter = self._identify()
                except Exception as e:  # never the job's problem: said once, and this process goes unseen
                    print(f"gkd: this process cannot report to the run ({type(e).__name__}: {e})", file=sys.stderr)
                    return
                if self.reporter is None:
                    continue
            try:
                now = time.time()
                if self.periodic is not None and now >= next_periodic:
                    next_periodic = now + PERIODIC_S
                    self.periodic(self.reporter)
                if self.main_wait is not None and self.make_wait is not None:
                    self._make_main_wait(now)
                view = self._view(now)
                phase, about = view.phase, view.about
                if phase is not shown.phase or about is not shown.about:
                    gone = [(c, c.ended) for c in (shown.phase, shown.about) if c is not None and c.ended]
                    last_ended = max((end for _, end in gone), default=last_ended)
                    if phase is None:
                        if shown.phase is not None:
                            ended = last_ended or now
                            self.reporter.emit(ev.PhaseEvent(phase="idle", started=ended, ts=ended))
                        last_ended = self._send_brief(last_ended, now)
                    else:
                        assert about is not None  # (a view with a phase is about a call)
                        if shown.phase is None or gone:  # what began and ended between the last phase and this one
                            last_ended = self._send_brief(last_ended, phase.started)
                        # a wait says whom it waits for when first shown (nothing is worked out before)
                        shown_detail = _progress_of(about) if about.progress is not None else about.detail
                        next_progress = now + PROGRESS_EVERY_S
                        # a phase shown again once what it called (in its own lane) has returned: from then,
                        # not from its start
                        returned = [end for c, end in gone if c.lane == phase.lane]
                        back = (max(returned) if phase is not shown.phase and returned
                                and max(returned) > phase.started else None)
                        self._show(view, shown_detail, now, back)
                    shown = view
                elif phase is None:
                    last_ended = self._send_brief(last_ended, now)
                else:
                    assert about is not None  # (a view with a phase is about a call)
                    self._brief.clear()  # inside a phase shown: the calls it makes are not the process's phases
                    if now >= next_progress:  # a wait's answers so far, and how many calls are in flight
                        next_progress = now + PROGRESS_EVERY_S
                        detail = _progress_of(about) if about.progress is not None else shown_detail
                        if detail != shown_detail or len(view.in_flight) != len(shown.in_flight):
                            shown_detail, shown = detail, view
                            self._show(view, detail, now)
                if self._task_stacks is not None and now >= next_asked:
                    next_asked = now + ASKED_EVERY_S
                    self._answer_task_stacks()
            except Exception as e:  # a bug of ours: said once; the watcher goes on with the next tick
                failed = _said_once(failed, e)

    def _make_main_wait(self, now: float) -> None:
        """The main thread's wait, once it has lasted SHOW_AFTER_S: a call (in the main thread's lane, from its
        start; its number counts the waits that lasted), with the progress and edges ``make_wait`` gives it. If
        the wait ended meanwhile, its wrapper may not have seen it made: the call is dropped here, never shown."""
        noted = self.main_wait
        if (noted is None or now - noted[1] < SHOW_AFTER_S or id(noted) in self.waits_made
                or (id(noted), noted[1]) == self._unmade):
            return
        assert self.make_wait is not None  # (asked only with one)
        self._unmade = (id(noted), noted[1])  # (until made: a wait ours cannot make is tried once, goes unseen)
        wait = self.make_wait(noted)
        token = self.enter(noted[0], deadline=wait.deadline, progress=wait.progress, wait=True, waits_on=wait.waits_on,
                           lane=self._main)
        self._active[token].started = noted[1]
        self.waits_made[id(noted)] = (noted, token, wait)
        self._unmade = None
        if self.main_wait is not noted and self.waits_made.pop(id(noted), None) is not None:
            self.leave(token)
            wait.ended(None)  # (its refs let go of here, not whenever this frame's locals go)

    def _may_sleep(self) -> bool:
        """Nothing to show or to send (nobody to send to: ``idle_unknown``), nothing asked, no call lately."""
        unknown = self.reporter is None
        return ((not unknown or self.idle_unknown) and not self._active and not self._lanes.running
                and (unknown or not self._brief) and self.main_wait is None
                and (self._task_stacks is None or not self._task_stacks.offered)
                and time.time() - self._last_started > SLEEP_AFTER_S)

    def _sleep(self) -> None:
        self._wake.clear()
        self.asleep = True
        # a call that began between the look and the flag saw none: it is looked for again
        if self._active or self.main_wait is not None or self._lanes.busy():
            self.asleep = False
            return
        self._wake.wait(SLEEP_MAX_S)
        self.asleep = False

    def _answer_task_stacks(self) -> None:
        answer = self._task_stacks
        if answer is None:
            return
        asyncs = [c for c in list(self._active.values()) if c.is_async]
        if asyncs:
            answer.offer()
        answer.answer_if_asked((c.name, c.number, c.started, c.lane) for c in asyncs)

    def _send_brief(self, since: float | None, until: float) -> float | None:
        """Calls that began after ``since`` and ended by ``until`` while no other call was under way, sent as
        phases after the fact (``Brief.send``); the end of the last one sent (else ``since``)."""
        if not self._brief:
            return since
        assert self.reporter is not None  # (the watcher sends once it has one)
        return self._brief.send(self.reporter.emit, since, until, list(self._active.values()) + self._lanes.running)

    def _show(self, view: View, detail: str, now: float, since: float | None = None) -> None:
        # a step's phases are instances by step; a method's, by call number
        phase, about = view.phase, view.about
        assert phase is not None and about is not None and self.reporter is not None  # (shown: a phase, a reporter)
        phase.shown = about.shown = True
        detail = f"{about.name}: {detail}" if about is not phase else detail
        if len(view.in_flight) > 1:
            detail = in_flight_said(view) + (f": {detail}" if detail else "")
        in_flight = len(view.in_flight)
        self.reporter.emit(ev.PhaseEvent(phase=phase.name, started=since or phase.started,
                                         deadline=about.deadline or phase.deadline, step=phase.step,
                                         call=None if phase.step is not None else phase.number,
                                         detail=detail[:300], in_flight=in_flight if in_flight > 1 else 0,
                                         waits_on=about.waits_on()[:ev.WAITS_ON_MAX] if about.waits_on else [],
                                         ts=now))


def _said_once(said: bool, e: Exception) -> bool:
    """A bug of ours in the watcher, said on stderr the first time (``said``: already); it goes on."""
    if not said:
        print(f"gkd: watching this process's calls failed ({type(e).__name__}: {e})", file=sys.stderr)
    return True


def _progress_of(call: Call) -> str:
    """What a call has left to do (a wait: who has answered), never raising into the watcher."""
    try:
        assert call.progress is not None  # (asked of a call that has one)
        return call.progress()
    except Exception as e:
        return f"{call.detail} (progress unknown: {type(e).__name__})".strip()
