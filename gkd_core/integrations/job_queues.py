"""A watched process's queues: what a pipeline's pane shows of them, their depth and how many went in.

A queue is found where the job puts into it (data_waits sees every set of asyncio's and threading's
primitives): an ``asyncio.Queue`` or a ``queue.Queue`` is one itself; a Condition or an Event notified by a
method of an object that holds a deque or a list (verl's ``MessageQueue``: a deque and a Condition over it)
is that container's. A gate (a Condition over a number, nothing to hold) is no queue, and is known as none
after its first set. Each set of a queue counts a put; what was taken out follows from the puts and the
depth, so a consumer that never waits costs nothing here.

The first set of an object costs a look at its holder (once); every other one a lookup and an addition. The
depths are read on the watcher's thread every few seconds (``len`` of a deque, ``qsize``), by weak
reference: a queue the job dropped is forgotten, never kept alive by us.

The staleness of what a queue's consumer takes: where the sample put says the version of the policy that made
it (a dict's key or an attribute named in ``VERSION_FIELDS``, an int), each put's version is kept in put order;
at each put and each read of the depth, the samples that left since (a queue is taken from its oldest end) are
counted by how many versions they were behind the newest put before them (the consumer's takes are not seen:
between two puts, the newest does not change). A queue whose first sample says no version is not looked at
again; samples that travel pickled (verl's) say none we can read, and are never unpickled.
"""

from __future__ import annotations

import asyncio
import collections
import os
import queue
import threading
import weakref
from types import FrameType
from typing import Any

from gkd_core.telemetry import events as ev

SEEN = "_gkd_queue"  # the attribute of a set object that holds its QueueSeen (or None: no queue)
QUEUE_FILES = {os.path.normcase(f) for f in (queue.__file__, asyncio.queues.__file__)}
PRIMITIVE_FILES = QUEUE_FILES | {os.path.normcase(f) for f in (threading.__file__, asyncio.locks.__file__)}
CONTAINERS = (collections.deque, list)  # what a queue of the job's own is held in, the likelier first
# where a sample says the version of the policy that made it, the likelier first
VERSION_FIELDS = ("param_version", "policy_version", "weight_version", "model_version", "version")
PENDING_MAX = 4096  # versions kept of samples not yet taken (a deeper queue: its oldest are not counted)


class QueueSeen:
    """One queue: its name, how to read its depth (``holder``'s ``attr``'s length, or its ``qsize``), the
    puts counted into it, and its samples' versions (``versioned``: None until its first sample is seen)."""

    __slots__ = ("name", "holder", "attr", "puts", "versioned", "newest", "pending", "behind", "_lock",
                 "__weakref__")

    def __init__(self, name: str, holder: Any, attr: str):
        self.name, self.attr, self.puts = name, attr, 0
        self.holder = weakref.ref(holder)
        self.versioned: bool | None = None
        self.newest = -1  # the newest version put
        self.pending: collections.deque[int] = collections.deque()  # versions put and not yet taken (-1: none)
        self.behind = [0] * ev.STALENESS_BUCKETS  # samples taken, by versions behind the newest
        self._lock = threading.Lock()  # (a put's thread and the watcher's both count what was taken)

    def put(self, args: tuple) -> None:
        """A put (``args``: the put's own, for a put that is not made yet): counted, with its sample's version;
        the samples taken since the put before are counted against the newest version then."""
        self.puts += 1
        if self.versioned is False:
            return
        holder = self.holder()
        if holder is None:
            return
        sample, depth_before = self._sample(holder, args)
        version = _version_of(sample)
        if self.versioned is None:
            self.versioned = version is not None
            if version is None:
                return
        with self._lock:
            self._count_taken(depth_before)
            if version is not None and version > self.newest:
                self.newest = version
            if len(self.pending) >= PENDING_MAX:
                self.pending.popleft()
            self.pending.append(-1 if version is None else version)

    def taken(self, depth: int) -> list[int] | None:
        """The samples taken so far by versions behind (those since the last put counted now, against the
        newest put: no put since, no newer version); None for a queue whose samples say no version."""
        if not self.versioned:
            return None
        with self._lock:
            self._count_taken(depth)
            return list(self.behind)

    def _count_taken(self, depth: int) -> None:
        """The oldest samples beyond ``depth`` left: each counted by how many versions behind the newest it was."""
        while len(self.pending) > depth:
            version = self.pending.popleft()
            if version >= 0:
                self.behind[min(max(0, self.newest - version), ev.STALENESS_BUCKETS - 1)] += 1

    def _sample(self, holder: Any, args: tuple) -> tuple[Any, int]:
        """The sample this put puts and the queue's depth before it: an asyncio.Queue's ``put_nowait`` argument
        (its put is seen before it is made), else the newest in its container (appended before the notify
        that is its put)."""
        if isinstance(holder, asyncio.Queue):
            return (args[0] if args else None), holder.qsize()
        container: Any = holder.queue if isinstance(holder, queue.Queue) else getattr(holder, self.attr, None)
        try:
            return container[-1], len(container) - 1
        except (IndexError, TypeError, KeyError):  # taken meanwhile, or a container we cannot index
            return None, 0

    def depth(self) -> int | None:
        """Its length now; None once the job let go of it (or its length cannot be read)."""
        holder = self.holder()
        if holder is None:
            return None
        try:
            return holder.qsize() if not self.attr else len(getattr(holder, self.attr))
        except (AttributeError, TypeError):  # its holder changed its shape (the attribute gone, or no length)
            return None


class Queues:
    """The queues of this process, as the sets into them were seen (the first ``FLOW_QUEUES_MAX``);
    ``not_the_jobs``: the folders whose code's queues are not the job's (ours, Ray's)."""

    def __init__(self, not_the_jobs: tuple[str, ...] = ()) -> None:
        self.not_the_jobs = not_the_jobs
        self._seen: weakref.WeakSet[QueueSeen] = weakref.WeakSet()
        self._lock = threading.Lock()

    def put(self, obj: Any, frame: FrameType | None, args: tuple = ()) -> None:
        """``obj`` was set by ``frame`` (a put into it, a notify over it; ``args``: the set's own): a put, if it
        is a queue's."""
        found = obj.__dict__.get(SEEN, False)
        if found is False:
            found = obj.__dict__[SEEN] = self._find(obj, frame)
        if found is not None:
            found.put(args)

    def now(self) -> list[ev.QueueDepth]:
        """Each queue still held: its name, depth, puts and its taken samples' staleness (read on the watcher's
        thread)."""
        with self._lock:
            seen = list(self._seen)
        out = [ev.QueueDepth(q.name, depth, q.puts, q.taken(depth) or []) for q in seen
               if (depth := q.depth()) is not None]
        return sorted(out, key=lambda q: q.name)

    def _find(self, obj: Any, frame: FrameType | None) -> QueueSeen | None:
        """The queue ``obj`` is part of, or None (a gate's Condition, an Event): looked for once."""
        job = _job_frame(frame)
        if job is None or job.f_code.co_filename.startswith(self.not_the_jobs) or _of_event(obj, frame):
            return None  # a set of Ray's or ours, or an Event's (a gate, never a queue)
        if isinstance(obj, asyncio.Queue):
            found = QueueSeen(_named(obj, _job_self(frame), "asyncio.Queue"), obj, "")
        elif (queue_self := _queue_of(obj, frame)) is not None:
            found = QueueSeen(_named(queue_self, _job_self(frame), "queue.Queue"), queue_self, "")
        elif isinstance(obj, threading.Condition) and frame is not None and \
                os.path.normcase(frame.f_code.co_filename) in QUEUE_FILES:
            return None  # a queue.Queue's other Conditions (not_full, all_tasks_done): its gets, not its puts
        else:
            holder = _job_self(frame)
            attr = _container(holder) if holder is not None else None
            if attr is None:
                return None
            found = QueueSeen(f"{type(holder).__name__}.{attr}", holder, attr)
        with self._lock:
            if len(self._seen) >= ev.FLOW_QUEUES_MAX:
                return None  # (a job of many queues: the first ones are said)
            self._seen.add(found)
        return found


def _queue_of(obj: Any, frame: FrameType | None) -> queue.Queue | None:
    """The ``queue.Queue`` whose ``not_empty`` Condition ``obj`` is, when its ``put`` notifies it."""
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in PRIMITIVE_FILES:
        owner = frame.f_locals.get("self")
        if isinstance(owner, queue.Queue) and owner.not_empty is obj:
            return owner
        frame = frame.f_back
    return None


def _of_event(obj: Any, frame: FrameType | None) -> bool:
    """Whether ``obj`` is an Event, or the Condition a ``threading.Event``'s ``set`` notifies."""
    if isinstance(obj, asyncio.Event):
        return True
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in PRIMITIVE_FILES:
        if isinstance(frame.f_locals.get("self"), threading.Event):
            return True
        frame = frame.f_back
    return False


def _job_frame(frame: FrameType | None) -> FrameType | None:
    """The job's frame that set it: the first from ``frame`` outward that is not the primitives' own."""
    while frame is not None and os.path.normcase(frame.f_code.co_filename) in PRIMITIVE_FILES:
        frame = frame.f_back
    return frame


def _job_self(frame: FrameType | None) -> Any:
    """The ``self`` of the job's frame that set it, if it has one."""
    job = _job_frame(frame)
    return job.f_locals.get("self") if job is not None else None


def _container(holder: Any) -> str | None:
    """The attribute of ``holder`` that holds its queue: its first deque, else its first list."""
    try:
        attrs = vars(holder)
    except TypeError:  # no __dict__ (slots): nothing found
        return None
    for kind in CONTAINERS:
        for name, value in attrs.items():
            if type(value) is kind and not name.startswith("_gkd"):
                return name
    return None


def _named(q: Any, holder: Any, kind: str) -> str:
    """``RolloutBuffer.samples`` when the object that put into ``q`` holds it as an attribute, else ``kind``."""
    try:
        attrs = vars(holder) if holder is not None else {}
    except TypeError:
        attrs = {}
    name = next((n for n, v in attrs.items() if v is q), None)
    return f"{type(holder).__name__}.{name}" if name else kind


def _version_of(sample: Any) -> int | None:
    """The version of the policy that made ``sample``, where it says one (``VERSION_FIELDS``), else None."""
    fields = sample if isinstance(sample, dict) else getattr(sample, "__dict__", None)
    if not fields:
        return None
    for name in VERSION_FIELDS:
        version = fields.get(name)
        if type(version) is int:
            return version
    return None
