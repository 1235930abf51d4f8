"""A watched process's waits through data: a call of the job's parked on a queue or at a gate waits on
whoever feeds the queue or opens the gate, not on nobody.

A pipeline's consumer waits in its queue's ``get`` (an asyncio.Queue, a Condition it awaits, a thread's
``queue.Queue``), and a producer parked at a staleness gate waits on an Event or Condition that the
trainer's call opens. Seen from Ray, both are calls in flight that wait on no call: the trainer at the
queue's end would be named, or the queue, while what holds is upstream. Patched where Python's primitives
wait and where they are set, so that a wait inside a call of the job (an actor's method, a served request)
is a wait of that call, on whoever set that object before:

- a wait: ``asyncio.Event.wait`` (not set yet), ``asyncio.Condition.wait`` (``wait_for`` waits in it),
  ``asyncio.Queue.get`` on an empty queue, and ``threading.Condition.wait`` (``threading.Event.wait`` and
  ``queue.Queue.get`` wait in one). Its detail says what it is and where the job waits ("an
  asyncio.Condition in run_loop (pipeline.py:88)", with the numbers the waiting object holds: the version
  a gate waits for), and its edge is a ``vocab.DataWait``: the methods of this worker whose calls set it.
- a set: ``asyncio.Event.set``, ``asyncio.Condition.notify`` (``notify_all`` through it),
  ``asyncio.Queue.put_nowait`` (``put`` through it), ``threading.Condition.notify`` (an Event's ``set`` and
  a queue's ``put`` notify one): inside a call of the job, the call's method is noted on the object, with
  when.

Who calls those methods only the callers know (Ray tells a callee nothing of its caller): each process says
which actor calls it sent lately (``SendsEvent``), and the diagnosis joins the two. A thread of the
process's own that sets it outside any call (a producer thread) is noted by its name (``~name``), and its
death with the error it died of (``threading.excepthook``): a queue only a dead thread fed waits forever.
While such a thread lives, what it waits on now (its own wait on a gate, kept in ``THREAD_WAITS``; its
request to a server, a call in its lane) is what a call waiting on its data waits on: slime's producer
thread, its gate or its server, at the end of the collector's chain. A consumer that polls (a queue's get
with a timeout, again and again) waits once, since its first poll in that call. What it cannot see yet: a
set by a task of the job's own outside any call (on an event loop: a producer that runs an event loop in
its thread), a producer that is a Ray task, and other libraries' primitives (trio, gevent, multiprocessing).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from gkd_core.integrations import job_frames
from gkd_core.integrations.activity import Activity
from gkd_core.integrations.calls import data_wait, running_async
from gkd_core.integrations.job_queues import Queues
from gkd_core.units import spoken
from gkd_core.vocab import DataWait

SET_BY = "_gkd_set_by"  # the attribute of a waited object that holds {method: when} of the calls that set it
SET_BY_MAX = 8  # methods remembered per object (the newest)
OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep  # gkd_core's own waits (the watcher's start)
_ours = threading.local()  # ``noting`` while this module notes a wait or a set: one inside that is not the job's
# a wait of a thread of the job's own outside any call, by the thread's ident, while it lasts: a call waiting
# on data that thread feeds waits on what it waits on (THREAD_DEPTH threads deep at most)
THREAD_WAITS: dict[int, Waiting] = {}
THREAD_DEPTH = 2
# a wait that begins this soon after the last one of its lane on the same object ended is that one going on
# (a poll: a queue's get with a timeout, again and again), since its start
POLL_GAP_S = 0.2
POLLS_KEPT = 1024
DIED: dict[str, str] = {}  # thread name -> the error it died of, as "ValueError: its message's first line"
DIED_MAX = 32  # threads' deaths remembered (the newest)
ERROR_MAX = 200  # characters of an error kept


def install(activity: Activity, queues: Queues, say_once: Callable[[str, BaseException], None]) -> None:
    """Patch asyncio's and threading's primitives (both are imported by now: Ray imports them); each set of
    the job's is also a put into ``queues`` where it is a queue's. A patch that fails is said once; the job
    and the rest of the watching go on without it."""
    notes = DataNotes(activity, queues, say_once)
    _note_deaths(threading.excepthook)
    for owner, name, patch in (
            (asyncio.Event, "wait", notes.async_wait("asyncio.Event", lambda e: e.is_set())),
            (asyncio.Condition, "wait", notes.async_wait("asyncio.Condition")),
            (asyncio.Queue, "get", notes.async_wait("asyncio.Queue", lambda q: not q.empty())),
            (threading.Condition, "wait", notes.thread_wait()),
            (asyncio.Event, "set", notes.setting),
            (asyncio.Condition, "notify", notes.setting),
            (asyncio.Queue, "put_nowait", notes.setting),
            (threading.Condition, "notify", notes.setting)):
        try:
            original = getattr(owner, name)
            setattr(owner, name, functools.wraps(original)(patch(original)))
        except Exception as e:  # a Python whose primitives we do not know: these waits go unseen
            say_once(f"watching waits on {owner.__module__}.{owner.__name__}.{name}", e)


class Waiting:
    """One wait of a call on an object (or of a thread of the job's own, outside any call: ``THREAD_WAITS``):
    what it is, where the job waits, and on whose calls."""

    __slots__ = ("obj", "kind", "frame", "started", "activity")

    def __init__(self, obj: Any, kind: str, frame: FrameType | None, activity: Activity, started: float | None = None):
        self.obj, self.kind, self.frame, self.activity = obj, kind, frame, activity
        self.started = started or time.time()

    def set_by(self) -> dict[str, float]:
        return dict(getattr(self.obj, SET_BY, None) or {})

    def setters(self) -> list[str]:
        """Who set it, as the edge says them: methods, and threads (``~name``, ``~name!`` once ended)."""
        alive = {t.name for t in threading.enumerate()}
        return sorted(DataWait.of_thread(DataWait.thread(m), DataWait.thread(m) in alive) if m.startswith("~") else m
                      for m in self.set_by())

    def waits_on(self, depth: int = THREAD_DEPTH) -> list[str]:
        """Its edge, a ``DataWait``; and where a thread of the worker's own set it, what that thread waits on
        now (a request to a server, a gate of its own): the producer inside the worker, followed."""
        setters = self.setters()
        edges = [DataWait(tuple(setters)).said()]
        for name in {DataWait.thread(m) for m in setters if m.startswith("~") and not DataWait.ended(m)}:
            edges += self._thread_now(name, depth)[0]
        return edges

    def _thread_now(self, name: str, depth: int) -> tuple[list[str], str]:
        """What the job's thread ``name`` waits on now, outside any call: its edges and what it is doing
        ("waiting for POST /generate on …"); ([], "") when it waits on nothing we see."""
        if depth <= 0:
            return [], ""
        edges: list[str] = []
        doing = ""
        for ident in [t.ident for t in threading.enumerate() if t.name == name]:
            waiting = THREAD_WAITS.get(ident) if ident is not None else None
            if waiting is not None and waiting is not self:
                edges += waiting.waits_on(depth - 1)
                doing = doing or waiting.where()
            for call in list(self.activity.in_flight()):  # its requests: calls in its lane (a thread's, off a loop)
                if call.lane == ident and call.wait and call.waits_on is not None:
                    edges += call.waits_on()  # (its progress, after: a request's says the server's process)
                    doing = doing or (call.progress() if call.progress is not None else call.detail)
        return edges, doing

    def where(self, with_numbers: bool = True) -> str:
        """``waiting on an asyncio.Condition in run_loop (pipeline.py:88; its numbers: version=3)``."""
        where = job_frames.job_frame(self.frame)
        said = f"waiting on {_article(self.kind)} {self.kind}"
        if where is not None:
            numbers = job_frames.numbers(where) if with_numbers else ""
            said += (f" in {where.f_code.co_name} ({os.path.basename(where.f_code.co_filename)}:{where.f_lineno}"
                     + (f"; its numbers: {numbers}" if numbers else "") + ")")
        return said

    def progress(self) -> str:
        """``waiting on an asyncio.Condition in run_loop (pipeline.py:88; its numbers: version=3,
        produced=11), set by update_param_version, last 40 s before this wait``; fed by a thread of the
        worker's own that waits now, what that thread waits on (``waiting on a queue.Queue in get_batch
        (buffer.py:51), fed by its thread rollout-producer, which is waiting for POST /generate on …``)."""
        said = self.where()
        set_by = self.set_by()
        if not set_by:
            return f"{said}, set by nothing yet"
        setters = self.setters()
        if all(DataWait.ended(m) for m in setters):  # only threads fed it, and they have ended: the cause
            names = [DataWait.thread(m) for m in setters]
            errors = [DIED[n] for n in names if n in DIED]
            return (f"{said}, set only by its thread {', '.join(names)}, which ended"
                    + (f" with {errors[0]}" if errors else " (no error seen)"))
        method, last = max(set_by.items(), key=lambda item: item[1])
        others = sorted(set(set_by) - {method})
        doing = self._thread_now(DataWait.thread(method), THREAD_DEPTH)[1] if method.startswith("~") else ""
        if doing:  # fed by a thread of its own, which waits now: what it waits on is what holds this wait
            return f"{self.where(with_numbers=False)}, fed by its thread {DataWait.thread(method)}, which is {doing}"

        def who(m: str) -> str:
            return f"its thread {DataWait.thread(m)}" if m.startswith("~") else m

        return (f"{said}, set by {who(method)}" + (f" (or {', '.join(map(who, others))})" if others else "")
                + f", last {spoken(max(0.0, self.started - last))} before this wait")


class DataNotes:
    """The patches' own work: a set noted on its object, a wait entered as a call of the job's."""

    def __init__(self, activity: Activity, queues: Queues, say_once: Callable[[str, BaseException], None]):
        self.activity, self.queues, self.say_once = activity, queues, say_once
        self._entered: dict[int, tuple[Any, float, object]] = {}  # a wait's token -> (its lane, start, call's mark)
        # lane -> (object, start, end, call's mark) of its last wait
        self._polls: dict[Any, tuple[Any, float, float, object]] = {}
        # waits in these packages' code are not the job's, though a call of the job's runs them: ours, Ray's
        ray = sys.modules.get("ray")
        self.not_the_jobs = (OURS, *([os.path.dirname(ray.__file__) + os.sep] if ray and ray.__file__ else []))
        queues.not_the_jobs = self.not_the_jobs

    def note_set(self, obj: Any, frame: FrameType | None, args: tuple = ()) -> None:
        """``obj`` was set (notified, put into) by the job's call running here, or by a thread of the process's
        own outside any call (a producer thread: ``~name``), at ``frame``; a set on an event loop outside a
        call (a task the job made) is not noted, nor one of Ray's or ours (``job_frames.set_by_job``);
        ``args``: the set's own (a put's sample)."""
        if not job_frames.set_by_job(frame, self.not_the_jobs):
            return
        if (running := running_async()) is not None:  # on a loop: an async call's (call_here's, without a look again)
            if not running[1]:
                return
            by = running[1]
        elif (here := self.activity.call_here()) is not None:
            by = here[1]
        else:
            thread = threading.current_thread()
            if thread is threading.main_thread():
                return
            by = DataWait.of_thread(thread.name, alive=True)
        set_by = obj.__dict__.get(SET_BY)
        if set_by is None:
            set_by = obj.__dict__[SET_BY] = {}
        set_by.pop(by, None)  # (the newest last: the oldest is dropped first)
        set_by[by] = time.time()
        if len(set_by) > SET_BY_MAX:
            del set_by[next(iter(set_by))]
        self.queues.put(obj, frame, args)

    def enter(self, obj: Any, kind: str, frame: FrameType | None) -> int | None:
        """A wait on ``obj`` begins: a call of the job's lane, if it is inside one (else None)."""
        if getattr(_ours, "noting", False):
            return None
        _ours.noting = True
        try:
            here = self.activity.call_here()
            if here is None or not job_frames.waited_by_job(frame, self.not_the_jobs):
                return None  # outside a call; or ours (the watcher's start) or Ray's own inside one: not its wait
            lane, _, mark = here
            # a poll (a queue's get with a timeout, again and again): the waits on one object, one after
            # another in one call, are one wait, since the first (its edges do not come and go with each poll)
            last = self._polls.pop(lane, None)
            since = (last[1] if last is not None and last[0] is obj and last[3] is mark
                     and time.time() - last[2] < POLL_GAP_S else None)
            waiting = Waiting(obj, kind, frame, self.activity, since)
            token = self.activity.enter(data_wait(kind), detail=f"waiting on {_article(kind)} {kind}",
                                        progress=waiting.progress, wait=True, waits_on=waiting.waits_on,
                                        lane=lane, started=waiting.started)
            self._entered[token] = (lane, waiting.started, mark)
            return token
        except Exception as e:  # never into the job's wait
            self.say_once("noting a wait on data", e)
            return None
        finally:
            _ours.noting = False

    def leave(self, token: int, obj: Any) -> None:
        """A wait on ``obj`` that ``enter`` noted has ended: kept a moment as its lane's last (a poll's next
        wait continues it)."""
        entered = self._entered.pop(token, None)
        self.activity.leave(token)
        if entered is not None:
            if len(self._polls) >= POLLS_KEPT:  # (lanes that ended: a thread's, a task's; not to grow forever)
                self._polls.clear()
            self._polls[entered[0]] = (obj, entered[1], time.time(), entered[2])

    def setting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def set_(obj, *args, **kwargs):
            if not getattr(_ours, "noting", False):  # (naming a thread can make one, whose start sets an Event)
                _ours.noting = True
                try:
                    self.note_set(obj, sys._getframe(1), args)
                except Exception as e:
                    self.say_once("noting a set of data", e)
                finally:
                    _ours.noting = False
            return original(obj, *args, **kwargs)

        return set_

    def async_wait(self, kind: str, ready: Callable[[Any], bool] | None = None):
        """The patch of an asyncio primitive's wait: ``ready`` says it returns at once (nothing noted)."""
        def patch(original: Callable[..., Any]) -> Callable[..., Any]:
            assert inspect.iscoroutinefunction(original), original  # (asyncio's waits are coroutines)

            async def wait(obj, *args, **kwargs):
                if ready is not None and ready(obj):
                    return await original(obj, *args, **kwargs)
                token = self.enter(obj, kind, sys._getframe(1))
                try:
                    return await original(obj, *args, **kwargs)
                finally:
                    if token is not None:
                        self.leave(token, obj)

            return wait

        return patch

    def thread_wait(self):
        """The patch of ``threading.Condition.wait``: an Event's wait or a queue's get, as the caller says; a
        wait of a thread of the job's own outside any call is kept in ``THREAD_WAITS`` while it lasts."""
        def patch(original: Callable[..., Any]) -> Callable[..., Any]:
            def wait(cond, *args, **kwargs):
                caller = sys._getframe(1)
                # Ray's (a Future's result, for every call of an async actor), ours: not the job's
                if not job_frames.waited_by_job(caller, self.not_the_jobs):
                    return original(cond, *args, **kwargs)
                kind = _thread_kind(caller)
                token = self.enter(cond, kind, caller)
                own = token is None and self.thread_waits(cond, kind, caller)
                try:
                    return original(cond, *args, **kwargs)
                finally:
                    if token is not None:
                        self.leave(token, cond)
                    elif own:
                        THREAD_WAITS.pop(threading.get_ident(), None)

            return wait

        return patch

    def thread_waits(self, cond: Any, kind: str, frame: FrameType) -> bool:
        """A thread of the job's own (not the main one, not on an event loop, in no call) waits on ``cond`` in
        the job's code: kept in ``THREAD_WAITS`` (a call waiting on what that thread feeds follows it there)."""
        if getattr(_ours, "noting", False) or threading.current_thread() is threading.main_thread():
            return False
        _ours.noting = True
        try:
            if (not job_frames.waited_by_job(frame, self.not_the_jobs) or running_async() is not None
                    or self.activity.call_here() is not None):
                return False
            THREAD_WAITS[threading.get_ident()] = Waiting(cond, kind, frame, self.activity)
            return True
        except Exception as e:  # never into the job's wait
            self.say_once("noting a thread's wait on data", e)
            return False
        finally:
            _ours.noting = False


def _note_deaths(theirs: Callable[[Any], object]) -> None:
    """``threading.excepthook`` noting each thread that dies of an error (its name, the error's first line) in
    ``DIED`` before the hook the process had (Python's prints the traceback): a wait on a queue that only that
    thread fed says it."""
    def excepthook(args) -> None:
        try:  # the process's own hook runs whatever happens here
            lines = str(args.exc_value).splitlines() if args.exc_value is not None else []
            if len(DIED) >= DIED_MAX:
                del DIED[next(iter(DIED))]
            name = args.thread.name if args.thread is not None else ""
            DIED[name] = f"{args.exc_type.__name__}: {lines[0] if lines else ''}"[:ERROR_MAX]
        finally:
            theirs(args)

    excepthook.__wrapped__ = theirs  # type: ignore[attr-defined]
    threading.excepthook = excepthook


def _thread_kind(caller: FrameType) -> str:
    """What a ``threading.Condition.wait`` is part of: an Event's wait, a queue's get, or the Condition's own."""
    code = caller.f_code
    if code.co_filename == threading.__file__ and code.co_name == "wait":
        return "threading.Event"
    if code.co_filename == queue.__file__ and code.co_name == "get":
        return "queue.Queue"
    return "threading.Condition"


def _article(kind: str) -> str:
    return "an" if kind[0].lower() in "aeiou" else "a"
