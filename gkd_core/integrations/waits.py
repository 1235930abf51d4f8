"""A watched process's waits on Ray: who it waits for, who has answered, and weight syncs as syncs.

Every actor call this process makes is noted (``RefBook``: the ref and the method; the actor is in
the ref itself, named once a wait asks), so a ``ray.get`` on a list of refs is shown as what it is: "1 of 2
answered; waiting for rollout/1.sync_rollout_weights". A wait whose calls are all a weight-sync method (verl's
``sync_rollout_weights``, ``update_weights``) is also a ``sync`` event, started, progressing and
done or failed, against the sync timeout (verl's ``nccl_timeout`` where the verl plugin read it):
the dashboard's sync gauge, with the pending workers, for a job that is not ours.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from gkd_core.telemetry import events as ev

BOOK_MAX = 65_536  # calls remembered at least; a wait on an older one says "an object" instead of its worker
SYNC_METHOD = re.compile(r"sync.*weight|weight.*sync|update_weights|broadcast_weights")
SYNC_TIMEOUT_ENV = "GKD_SYNC_TIMEOUT_S"  # where nothing better is known (verl's nccl_timeout is)
DEFAULT_SYNC_TIMEOUT_S = 600.0  # NCCL's and verl's default
SENDS_FORGET_S = 600.0  # an actor call not sent for this long is no longer among those a process says it sends


class RefBook:
    """ref -> (worker, method) of the calls this process made: the newest ``BOOK_MAX`` at least, in two halves:
    ``newer`` fills, and once it holds ``BOOK_MAX`` the older half is dropped whole and it starts again.

    A call is noted at every actor call of a job (the actor call's wrapper itself stores into ``newer``): one
    store of the method's name, nothing looked up. Which actor it went to is in the ref (its task's actor id),
    named by ``name_of_actor`` only when a wait asks ``who``: most refs are waited on and gone within a
    millisecond, and the name can take a read of Ray's key-value store. A caller that knows the worker's name
    (``sent``) stores both."""

    def __init__(self, name_of_actor: Callable[[str], str] | None = None):
        self.newer: dict[bytes, str | tuple[str, str]] = {}
        self._older: dict[bytes, str | tuple[str, str]] = {}
        self._name_of_actor = name_of_actor

    def sent(self, worker: str, method: str, out: Any) -> None:
        self.note((worker, method), out)

    def note(self, call: str | tuple[str, str], out: Any) -> None:
        """``out``: what an actor call returned (a ref, a list of them, or a generator, which is not kept);
        ``call``: its method, or (worker, method)."""
        for ref in out if isinstance(out, list) else [out]:
            binary = getattr(ref, "binary", None)
            if binary is not None:
                self.newer[binary()] = call
        if len(self.newer) >= BOOK_MAX:
            self.turn(self.newer)

    def turn(self, full: dict) -> None:
        """``full`` (the ``newer`` its caller filled) becomes the older half: once, when two threads see it full."""
        if self.newer is full:
            self._older, self.newer = full, {}

    def who(self, ref: Any) -> tuple[str, str] | None:
        binary = getattr(ref, "binary", None)
        if binary is None:
            return None
        key = binary()
        call = self.newer.get(key) or self._older.get(key)
        if call is None or isinstance(call, tuple):
            return call
        if self._name_of_actor is None:
            return None
        return self._name_of_actor(ref.task_id().actor_id().hex()), call


class Sends:
    """The actor calls this process sent lately, as ``Worker.method``, read off its book of calls every few
    seconds (only what was noted since the last read): whom it feeds, for a wait on data that only the
    callers of a method can end (``SendsEvent``). A call not sent for ``SENDS_FORGET_S`` is no longer said."""

    def __init__(self, book: RefBook):
        self.book = book
        self._read = (0, 0)  # (the id of the book's newer half, how many of its entries were read)
        self._seen: dict[tuple[bytes | str, str], float] = {}  # (actor id or worker, method) -> when last seen
        self._said: list[str] = []

    def now(self) -> list[str] | None:
        """The calls sent lately, when they changed since the last time asked (else None)."""
        newer = self.book.newer
        start = self._read[1] if self._read[0] == id(newer) else 0
        # (taken whole in one C call: the job's threads add to it meanwhile, and a dict may not grow while
        # it is iterated)
        added = list(itertools.islice(newer.items(), start, None))
        self._read = (id(newer), start + len(added))
        mono = time.monotonic()
        for key, call in added:
            # an actor call's ref is its task's id and an index, and an actor task's id ends with its actor's
            self._seen[call if isinstance(call, tuple) else (key[8:24], call)] = mono
        for old in [k for k, when in self._seen.items() if mono - when > SENDS_FORGET_S]:
            del self._seen[old]
        newest = sorted(self._seen, key=self._seen.__getitem__)[-ev.SENDS_MAX:]
        said = sorted({f"{self._worker(to)}.{method}" for to, method in newest})
        if said == self._said:
            return None
        self._said = said
        return said

    def _worker(self, to: bytes | str) -> str:
        if isinstance(to, str):
            return to
        name_of = self.book._name_of_actor
        return name_of(to.hex()) if name_of is not None else f"actor {to.hex()[:8]}"


def _names(calls: list[tuple[str, str] | None]) -> str:
    """`rollout/1.sync_rollout_weights` for one; `train of Learner/3, Learner/9` for several of one method."""
    known = [c for c in calls if c is not None]
    unknown = len(calls) - len(known)
    methods = {m for _, m in known}

    def some(items: list[str]) -> str:
        return ", ".join(items[:6]) + (f" … (+{len(items) - 6})" if len(items) > 6 else "")

    if len(known) == 1:
        out = f"{known[0][0]}.{known[0][1]}"
    elif len(methods) == 1:
        out = f"{methods.pop()} of {some([w for w, _ in known])}"
    else:
        out = some([f"{w}.{m}" for w, m in known])
    if unknown:
        out += (", " if out else "") + f"{unknown} other object(s)"
    return out


class Wait:
    """One wait of the main thread on ``refs``: its phase detail and, for a weight sync, its sync events.

    Made of a wait that has lasted long enough to be shown (the watcher's thread: most of a job's waits
    return within milliseconds, and are only noted, by ray_hook), or that a cancel asks about. Who it waits
    for, and whether it is a sync, is found the first time something asks, from the refs and the book of
    calls."""

    _sync_ids = itertools.count(1)

    @classmethod
    def next_sync_id(cls) -> int:
        """The next sync's number in this process (a wait's, or a sync said in parts)."""
        return next(cls._sync_ids)

    def __init__(self, book: RefBook, refs: list, emit: Callable[[ev.Event], None], sync_timeout_s: float | None,
                 step: int | None, whole: bool = True, num_returns: int = 1, in_sync: bool = False,
                 started: float | None = None, deadline: float | None = None):
        """``whole``: the wait returns once every ref has (``ray.get``), so its normal end is a sync's end;
        a ``ray.wait`` may return on the first, and is never a sync. A wait that needs every ref (``whole``,
        or a ``ray.wait`` for ``num_returns`` of all of them) waits on each: each is an edge of the wait-for
        graph; one that a part of them may end waits on no one of them. ``in_sync``: the wait is a part of a
        sync already said (verl's checkpoint engine, in parts), never a sync of its own."""
        self.book, self._given, self.emit, self.step, self.in_sync = book, refs, emit, step, in_sync
        self.whole, self.num_returns, self.sync_timeout_s = whole, num_returns, sync_timeout_s
        self.started = time.time() if started is None else started
        self.deadline = deadline  # (time.time) the wait's own timeout, where it has one
        self.said_sync = False
        self._over = False
        self._resolved = False
        self._lock = threading.Lock()  # progress (the watcher's thread) never says a sync after its end

    def resolve(self) -> Wait:
        """Who it waits for (``refs``, ``calls``, ``pending``), and whether it is a sync: found once, on first
        asking, by whichever thread asks first (the watcher's, a cancel's)."""
        if not self._resolved:
            with self._lock:
                if not self._resolved:
                    self._find()
        return self

    def _find(self) -> None:
        # ray.get([r, r]) is allowed; ray.wait([r, r]) raises
        self.refs = list({(r.binary() if hasattr(r, "binary") else id(r)): r for r in self._given}.values())
        self.calls = [self.book.who(r) for r in self.refs]
        methods = {c[1] for c in self.calls if c is not None}
        self.is_sync = (not self.in_sync and self.whole and bool(methods)
                        and all(SYNC_METHOD.search(m) for m in methods) and None not in self.calls)
        self.timeout_s = self.sync_timeout_s or env_timeout()
        self.sync_id = self.next_sync_id() if self.is_sync else 0
        self.pending = [c[0] for c in self.calls if c is not None]
        self.unanswered = list(self.calls)  # as the newest ``progress`` found them
        self.needs_all = self.whole or self.num_returns >= len(self.refs)
        self._resolved = True

    def detail(self) -> str:
        self.resolve()
        return f"waiting for {_names(self.calls)}" if self.calls else "waiting"

    def progress(self) -> str:
        """Asked from the watcher's thread: who has answered, without fetching anything."""
        import ray

        self.resolve()
        refs = self.refs  # (read once: ``ended`` lets go of them meanwhile)
        if not refs:
            return f"all {len(self.calls)} answered"
        try:
            ready, pending = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        except Exception as e:  # whom it waits for is still known
            return f"{self.detail()} (who has answered unknown: {type(e).__name__})"
        still = {r.binary() for r in pending}
        waiting = [c for r, c in zip(refs, self.calls, strict=True) if r.binary() in still]
        self.unanswered = waiting
        if self.is_sync:
            with self._lock:
                if not self._over:
                    self.pending = [c[0] for c in waiting if c is not None]
                    self._sync("started" if not self.said_sync else "progress")
        if not waiting:
            return f"all {len(refs)} answered"
        return f"{len(ready)} of {len(refs)} answered; waiting for {_names(waiting)}"

    def waits_on(self) -> list[str]:
        """The actor calls not answered yet, as ``Worker.method``: this wait's edges in the wait-for graph
        (a ref this process did not make by an actor call, a task's or a put object's, leads to nobody)."""
        self.resolve()
        if not self.needs_all:
            return []
        return [f"{worker}.{method}" for worker, method in dict.fromkeys(c for c in self.unanswered if c is not None)]

    def _sync(self, state: str, error: str = "") -> None:
        self.said_sync = True
        everyone = [c[0] for c in self.calls if c is not None]
        self.emit(ev.SyncEvent(sync_id=self.sync_id, state=state, timeout_s=self.timeout_s,
                               elapsed_s=time.time() - self.started, pending=self.pending,
                               done=[w for w in everyone if w not in self.pending], error=error[:300], step=self.step))

    def ended(self, error: BaseException | None) -> None:
        """On the main thread, as the wait returns or raises. A sync is said only once it has lasted long
        enough to be shown (its progress was asked): a fast sync costs no events.

        Its refs are let go of here: an ended call is kept a while by the watcher (a brief call, sent after
        the fact), and an ObjectRef freed after the job's ``ray.shutdown`` ends the process ("the core worker
        has already been shutdown"): verl's tests shut Ray down and start it again in one process."""
        with self._lock:
            self._given = []
            if self._resolved:
                self.refs = []  # (who it waited for, ``calls``, stays known)
            self._over = True
            if not self.said_sync:
                return
            if error is None:
                self.pending = []
                self._sync("done")
            else:
                kind = "timed_out" if type(error).__name__ == "GetTimeoutError" else "failed"
                self._sync(kind, f"{type(error).__name__}: {error}")


def env_timeout() -> float:
    try:
        return float(os.environ.get(SYNC_TIMEOUT_ENV, DEFAULT_SYNC_TIMEOUT_S))
    except ValueError:
        return DEFAULT_SYNC_TIMEOUT_S
