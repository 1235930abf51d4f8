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
A consumer that polls (a queue's get with a timeout, again and again) is seen as long as each poll lasts
the 20 ms a wait takes to be shown. What it cannot see yet: a set by a task of the job's own outside any
call (on an event loop), and other libraries' primitives (trio, gevent, multiprocessing).
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

from gkd_core.integrations.activity import Activity
from gkd_core.integrations.calls import running_async
from gkd_core.units import spoken
from gkd_core.vocab import DataWait

SET_BY = "_gkd_set_by"  # the attribute of a waited object that holds {method: when} of the calls that set it
SET_BY_MAX = 8  # methods remembered per object (the newest)
NUMBERS_MAX = 6  # numbers of the waiting object said with the wait (a gate's version and its bound)
# frames of the primitives themselves, skipped to find the line of the job's that waits
OWN_FILES = {os.path.normcase(f) for f in (threading.__file__, queue.__file__, asyncio.locks.__file__,
                                          asyncio.queues.__file__, __file__)}
OURS = os.path.dirname(os.path.dirname(__file__)) + os.sep  # gkd_core's own waits (the watcher's start)
_ours = threading.local()  # ``noting`` while this module notes a wait or a set: one inside that is not the job's
DIED: dict[str, str] = {}  # thread name -> the error it died of, as "ValueError: its message's first line"
DIED_MAX = 32  # threads' deaths remembered (the newest)
ERROR_MAX = 200  # characters of an error kept


def install(activity: Activity, say_once: Callable[[str, BaseException], None]) -> None:
    """Patch asyncio's and threading's primitives (both are imported by now: Ray imports them). A patch that
    fails is said once; the job and the rest of the watching go on without it."""
    notes = DataNotes(activity, say_once)
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
    """One wait of a call on an object: what it is, where the job waits, and on whose calls."""

    __slots__ = ("obj", "kind", "frame", "started")

    def __init__(self, obj: Any, kind: str, frame: FrameType | None):
        self.obj, self.kind, self.frame, self.started = obj, kind, frame, time.time()

    def set_by(self) -> dict[str, float]:
        return dict(getattr(self.obj, SET_BY, None) or {})

    def setters(self) -> list[str]:
        """Who set it, as the edge says them: methods, and threads (``~name``, ``~name!`` once ended)."""
        alive = {t.name for t in threading.enumerate()}
        return sorted(DataWait.of_thread(DataWait.thread(m), DataWait.thread(m) in alive) if m.startswith("~") else m
                      for m in self.set_by())

    def waits_on(self) -> list[str]:
        return [DataWait(tuple(self.setters())).said()]

    def progress(self) -> str:
        """``waiting on an asyncio.Condition in run_loop (pipeline.py:88; its numbers: version=3,
        produced=11), set by update_param_version, last 40 s before this wait``."""
        where = _job_frame(self.frame)
        said = f"waiting on {_article(self.kind)} {self.kind}"
        if where is not None:
            numbers = _numbers(where)
            said += (f" in {where.f_code.co_name} ({os.path.basename(where.f_code.co_filename)}:{where.f_lineno}"
                     + (f"; its numbers: {numbers}" if numbers else "") + ")")
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

        def who(m: str) -> str:
            return f"its thread {DataWait.thread(m)}" if m.startswith("~") else m

        return (f"{said}, set by {who(method)}" + (f" (or {', '.join(map(who, others))})" if others else "")
                + f", last {spoken(max(0.0, self.started - last))} before this wait")


class DataNotes:
    """The patches' own work: a set noted on its object, a wait entered as a call of the job's."""

    def __init__(self, activity: Activity, say_once: Callable[[str, BaseException], None]):
        self.activity, self.say_once = activity, say_once
        # waits in these packages' code are not the job's, though a call of the job's runs them: ours, Ray's
        ray = sys.modules.get("ray")
        self.not_the_jobs = (OURS, *([os.path.dirname(ray.__file__) + os.sep] if ray and ray.__file__ else []))

    def note_set(self, obj: Any) -> None:
        """``obj`` was set (notified, put into) by the job's call running here, or by a thread of the process's
        own outside any call (a producer thread: ``~name``); a set on an event loop outside a call (a task the
        job made) is not noted."""
        here = self.activity.call_here()
        if here is not None:
            by = here[1]
        else:
            thread = threading.current_thread()
            if thread is threading.main_thread() or running_async() is not None:
                return
            by = DataWait.of_thread(thread.name, alive=True)
        set_by = obj.__dict__.get(SET_BY)
        if set_by is None:
            set_by = obj.__dict__[SET_BY] = {}
        set_by.pop(by, None)  # (the newest last: the oldest is dropped first)
        set_by[by] = time.time()
        if len(set_by) > SET_BY_MAX:
            del set_by[next(iter(set_by))]

    def enter(self, obj: Any, kind: str, frame: FrameType | None) -> int | None:
        """A wait on ``obj`` begins: a call of the job's lane, if it is inside one (else None)."""
        if getattr(_ours, "noting", False):
            return None
        _ours.noting = True
        try:
            here = self.activity.call_here()
            if here is None:
                return None
            where = _job_frame(frame)
            if where is not None and where.f_code.co_filename.startswith(self.not_the_jobs):
                return None  # ours (the watcher's start) or Ray's own, inside a call of the job: not its wait
            waiting = Waiting(obj, kind, frame)
            return self.activity.enter(f"{kind} wait", detail=f"waiting on {_article(kind)} {kind}",
                                       progress=waiting.progress, wait=True, waits_on=waiting.waits_on,
                                       lane=here[0])
        except Exception as e:  # never into the job's wait
            self.say_once("noting a wait on data", e)
            return None
        finally:
            _ours.noting = False

    def setting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def set_(obj, *args, **kwargs):
            if not getattr(_ours, "noting", False):  # (naming a thread can make one, whose start sets an Event)
                _ours.noting = True
                try:
                    self.note_set(obj)
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
                        self.activity.leave(token)

            return wait

        return patch

    def thread_wait(self):
        """The patch of ``threading.Condition.wait``: an Event's wait or a queue's get, as the caller says."""
        def patch(original: Callable[..., Any]) -> Callable[..., Any]:
            def wait(cond, *args, **kwargs):
                caller = sys._getframe(1)
                token = self.enter(cond, _thread_kind(caller), caller)
                try:
                    return original(cond, *args, **kwargs)
                finally:
                    if token is not None:
                        self.activity.leave(token)

            return wait

        return patch


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


def _job_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame of the job's own, from ``frame`` outward (the primitives' frames skipped)."""
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in OWN_FILES:
        frame = frame.f_back
    return frame


def _numbers(frame: FrameType) -> str:
    """The numbers the waiting code holds (its locals', and its ``self``'s public attributes'), at most
    ``NUMBERS_MAX``: ``version=3, produced=11``. Numbers only: a string can be a key."""
    found: dict[str, int | float] = {}
    f_locals = frame.f_locals
    owner = f_locals.get("self")
    for name, value in [*f_locals.items(), *(vars(owner).items() if hasattr(owner, "__dict__") else ())]:
        if (len(found) < NUMBERS_MAX and not name.startswith("_") and name not in found
                and type(value) in (int, float)):
            found[name] = value
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in found.items())


def _article(kind: str) -> str:
    return "an" if kind[0].lower() in "aeiou" else "a"
