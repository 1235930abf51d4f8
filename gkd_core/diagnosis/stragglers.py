"""Who is late, named by its peers rather than by a deadline.

Workers of one role (one actor class) that run the same instance of a phase (the same phase at
the same step; for a method, the same call number; in Ray-only mode the same method called within a
few seconds) form a group.
Once at least half of a member's peers have finished that instance, the member still in it is
late when its time exceeds max(5 s, 3x the median of its peers' times); critical at twice that.
A worker with no such peers is compared with its own history: max(5 s, 5x its median for that
phase) is "slower than usual". The root blocked by a straggler (the broadcasting student, the
driver waiting in ``ray.get``) is never named: it has no peers in its role, and its own-history
finding gives way while a peer-named straggler is late.

A pass costs what moved since the last one, not the size of the run: ``SpanIndex`` keeps the
finished spans, who is in which instance and each one's own threshold between passes, reads only the
workers the state fed it (``state.feed``), and skips an instance in which nobody can be late yet. At
65,536 workers with 16 spans each, a pass that read everything took 0.76 s; a pass now takes a few
milliseconds.
"""

from __future__ import annotations

import math
import statistics
import threading
import weakref
from typing import NamedTuple

from gkd_core.node.cpu_load import NODE_BUSY
from gkd_core.state import PhaseSpan, RunState, WorkerState
from gkd_core.state.feed import Feed
from gkd_core.vocab import WORKER_ENDED

MIN_S = 5.0
PEER_FACTOR = 3.0
OWN_FACTOR = 5.0
OWN_MIN_SAMPLES = 3
SAME_CALL_S = 5.0  # phases without a step: started within this of each other is the same call
EXACT_UP_TO = 256  # more finished peers than this in a stepless call's windows: counted once per window
NOT_WORK = frozenset({"", "idle", "serve", "ready", "watching", NODE_BUSY, *WORKER_ENDED})


def set_up(phase: str) -> bool:
    """A set-up phase (ours: init, init_model, init_engine; a foreign job's method may end in _init): each
    is another step under the one name (the driver's ray.init, then its actors, then its agents), so its
    own history says nothing of the next; their deadlines (trainer.init_timeout_s, the phase's own, and
    ``heartbeat_stale``'s set-up deadline) watch them instead."""
    return phase.startswith("init") or phase.endswith("_init")


class Late(NamedTuple):
    src: str
    phase: str
    step: int | None
    elapsed: float
    threshold: float
    baseline: float  # the peers' median (by peers) or the worker's own median (own history)
    n_done: int  # peers that finished this instance, or own samples
    n_group: int  # the peers that ran it (done and still in it), or own samples
    by: str  # "peers" or "own"
    severity: str


def _instance(phase: str, step: int | None, started: float, call: int | None = None) -> tuple:
    if step is not None:
        return (phase, step)
    if call is not None:  # the n-th call of a method: the n-th call of its peers, however far apart they began
        return (phase, ("call", call))
    return (phase, None, math.floor(started / SAME_CALL_S))


def _neighbours(key: tuple) -> list[tuple]:
    if key[1] is not None:
        return [key]
    return [key, (key[0], None, key[2] - 1), (key[0], None, key[2] + 1)]


class SpanIndex:
    """What the straggler rule needs of a RunState, kept from one pass to the next: the finished spans
    of each role by instance of a phase, the workers at work by the instance they are in, each one's
    own-history threshold, and the medians of the peers.

    Built afresh each pass it read every span of every worker: at 65,536 workers with SPANS_KEEP spans
    each, a million spans, 0.76 s of the supervisor's every pass. Kept, a pass is fed the workers that
    moved since the last (``state.feed``) and reads only theirs. The reducer only appends spans and drops
    the oldest, so a worker's new spans are those after the newest one seen; anything else (a new state, a
    worker's spans replaced) is read afresh.
    """

    def __init__(self) -> None:
        self._state: weakref.ref | None = None
        self._feed: Feed | None = None  # the state's word of the workers that changed (state.feed)
        self._pending: list[WorkerState] = []  # fed, not read yet (keep_up reads a slice at a time)
        self._pos: dict[str, int] = {}  # worker -> its place in the state (the findings' order)
        # role -> instance -> {worker: (started, duration)} of the finished spans (a worker's newest wins)
        self.finished: dict[str, dict[tuple, dict[str, tuple[float, float]]]] = {}
        # role -> instance -> {worker: its state} of the workers in a work phase now
        self.at_work: dict[str, dict[tuple, dict[str, WorkerState]]] = {}
        self.role_size: dict[str, int] = {}  # role -> its workers, at work or not
        # worker -> (its role, its newest span seen, the instance of each of its spans: None for not work)
        self._seen: dict[str, tuple[str, PhaseSpan | None, list[tuple | None]]] = {}
        self._where: dict[str, tuple[str, tuple | None]] = {}  # worker -> (role, the instance it is in)
        # worker -> (past this time in its phase it is slower than usual, how many spans, their median)
        self.own: dict[str, tuple[float, int, float]] = {}
        # (role, instance) -> [no member began it before this, no member is slower than usual before this]:
        # lower bounds, so that a pass skips an instance in which nobody can be late yet
        self.bounds: dict[tuple[str, tuple], list[float]] = {}
        # (role, instance) -> when its finished spans last changed (one clock for all: an instance gone and
        # back never meets a median of its earlier self)
        self._version: dict[tuple[str, tuple], int] = {}
        self._tick = 0
        self._medians: dict[tuple, tuple[tuple, int, float]] = {}  # (role, instances) -> (versions, n, median)

    def update(self, state: RunState, budget: int | None = None) -> None:
        """Read the workers that changed; at most ``budget`` of them now (the rest at the next call)."""
        if self._state is None or self._state() is not state:
            type(self).__init__(self)  # every field as new, for another state
            self._state = weakref.ref(state)
            self._feed = state.feed()
            self._pending = list(state.workers.values())
        left = math.inf if budget is None else budget
        if self._pending:  # (everything: a new state's workers, or after the feed overflowed)
            taken = self._pending[:len(self._pending) if budget is None else budget]
            for w in taken:
                self._move(w)
            del self._pending[:len(taken)]
            left -= len(taken)
        if left > 0 and self._feed is not None:
            changed = self._feed.take(None if budget is None else int(left))
            if changed is None:  # (the feed overflowed: everything again)
                self._pending = list(state.workers.values())
            else:
                for w in changed.values():
                    self._move(w)
        if len(self._where) > len(state.workers):  # a worker gone from the state
            for src in [src for src in self._where if src not in state.workers]:
                self._forget(src)

    def _move(self, w: WorkerState) -> None:
        src, role = w.src, w.role or w.src
        self._pos.setdefault(src, len(self._pos))
        spans = w.spans
        s = self._seen.get(src)
        if s is None or s[1] is not (spans[-1] if spans else None) or s[0] != role or len(s[2]) != len(spans):
            self._take(src, role, spans, s)
        key = None if w.phase in NOT_WORK else _instance(w.phase, w.phase_step, w.phase_since, w.phase_call)
        where = self._where.get(src)
        if where != (role, key):
            if where is not None:
                self._leave(src, where)
            self._where[src] = (role, key)
            self.role_size[role] = self.role_size.get(role, 0) + 1
            if key is not None:
                self.at_work.setdefault(role, {}).setdefault(key, {})[src] = w
        hist = [] if set_up(w.phase) else [span.ended - span.started for span in spans if span.phase == w.phase]
        med = statistics.median(hist) if hist else 0.0
        thr = max(MIN_S, OWN_FACTOR * med) if len(hist) >= OWN_MIN_SAMPLES else math.inf
        self.own[src] = (thr, len(hist), med)
        if key is not None:
            b = self.bounds.setdefault((role, key), [math.inf, math.inf])
            b[0], b[1] = min(b[0], w.phase_since), min(b[1], w.phase_since + thr)

    def _leave(self, src: str, where: tuple[str, tuple | None]) -> None:
        role, key = where
        self.role_size[role] -= 1
        if key is not None:
            groups = self.at_work[role]
            del groups[key][src]
            if not groups[key]:
                del groups[key]
                del self.bounds[(role, key)]

    def _forget(self, src: str) -> None:
        self._leave(src, self._where.pop(src))
        s = self._seen.pop(src, None)
        if s is not None:
            self._drop(src, s)
        self.own.pop(src, None)

    def _take(self, src: str, role: str, spans: list[PhaseSpan], s: tuple | None) -> None:
        new_from = 0
        if s is not None and s[0] == role and s[1] is not None:
            new_from = next((j + 1 for j in range(len(spans) - 1, -1, -1) if spans[j] is s[1]), -1)
        if s is not None and (new_from <= 0 or s[0] != role):  # not the same spans grown: read afresh
            self._drop(src, s)
            s, new_from = None, 0
        kept = s[2][len(s[2]) - new_from:] if s is not None else []
        evicted = s[2][:len(s[2]) - new_from] if s is not None else []
        by_instance = self.finished.setdefault(role, {})
        for span in spans[new_from:]:
            key = None if span.phase in NOT_WORK else _instance(span.phase, span.step, span.started, span.call)
            kept.append(key)
            if key is not None:
                by_instance.setdefault(key, {})[src] = (span.started, span.ended - span.started)
                self._touch(role, key)
        for key in evicted:
            if key is not None and key not in kept:
                self._remove(role, key, src)
        self._seen[src] = (role, spans[-1] if spans else None, kept)

    def _drop(self, src: str, s: tuple) -> None:
        for key in set(s[2]):
            if key is not None:
                self._remove(s[0], key, src)

    def _remove(self, role: str, key: tuple, src: str) -> None:
        by_instance = self.finished.get(role, {})
        fin = by_instance.get(key)
        if fin is not None and fin.pop(src, None) is not None:
            self._touch(role, key)
            if not fin:
                del by_instance[key]
                del self._version[(role, key)]

    def _touch(self, role: str, key: tuple) -> None:
        self._tick += 1
        self._version[(role, key)] = self._tick

    def median(self, role: str, keys: tuple[tuple, ...]) -> tuple[int, float]:
        """(how many finished, their median time) over the instances ``keys`` of ``role``."""
        versions = tuple(self._version.get((role, k), 0) for k in keys)
        cached = self._medians.get((role, keys))
        if cached is None or cached[0] != versions:
            by_instance = self.finished.get(role, {})
            durs = [dur for k in keys for _, dur in by_instance.get(k, {}).values()]
            cached = self._medians[(role, keys)] = (versions, len(durs), statistics.median(durs) if durs else 0.0)
            if len(self._medians) > 4 * max(64, len(self._version)):  # the medians of instances gone, forgotten
                self._medians = {k: v for k, v in self._medians.items()
                                 if all((k[0], i) in self._version for i in k[1])}
        return cached[1], cached[2]

    def in_order(self, found: list[Late], state: RunState) -> list[Late]:
        """The findings role by role (in the order of each role's first worker), then by rank (Learner/2
        before Learner/10, whichever registered first), then in the order of the state's workers."""
        if len(found) < 2:
            return found
        roles = {state.workers[late.src].role or late.src for late in found}
        first: dict[str, int] = {}
        if len(roles) > 1:  # (rare: a walk over the workers to the last role's first)
            for src, w in state.workers.items():
                first.setdefault(w.role or src, len(first))
                if roles.issubset(first):
                    break
        def key(late: Late) -> tuple:
            w = state.workers[late.src]
            return first.get(w.role or late.src, 0), w.rank if w.rank is not None else -1, self._pos.get(late.src, 0)
        return sorted(found, key=key)


KEEP_UP_BUDGET = 4096  # workers read per keep_up: about 20 ms, so that a step's burst is read in slices


def index_of(state: RunState) -> tuple[SpanIndex, threading.Lock]:
    """``state``'s own index, for as long as the state lives (a supervisor's one state, a dashboard's Ray-state
    source's); the lock keeps two threads diagnosing one state from reading a half-made index."""
    return state.kept("spans", lambda: (SpanIndex(), threading.Lock()))


def keep_up(state: RunState) -> None:
    """Read some of what moved into ``state``'s index now, between the passes: after a burst of phase
    changes (65,536 workers at a step's end) the supervisor reads them a slice per 50 ms tick, its
    ingest never waits for all of them at once, and the pass finds little left to read."""
    index, lock = index_of(state)
    with lock:
        index.update(state, KEEP_UP_BUDGET)


def late_workers(state: RunState, now: float, index: SpanIndex | None = None) -> list[Late]:
    """The late workers of ``state`` at ``now``, named by their peers, or else by their own history.
    ``index``: the one to keep (by default ``state``'s own, kept between calls; a fresh ``SpanIndex()``
    reads everything, as the tests' reference)."""
    if index is None:
        index, lock = index_of(state)
        with lock:
            return _late_workers(state, now, index)
    return _late_workers(state, now, index)


def _late_workers(state: RunState, now: float, index: SpanIndex) -> list[Late]:
    index.update(state)
    named: list[Late] = []
    own: list[Late] = []
    for role, by_key in index.at_work.items():
        finished = index.finished.get(role, {}) if index.role_size.get(role, 0) > 1 else {}
        for key, members in by_key.items():
            bounds = index.bounds[(role, key)]
            if now - bounds[0] <= MIN_S:
                continue  # nobody has been in it long enough to be late
            fin = finished.get(key, {})
            shared: tuple[int, float, int] | None = None  # (finished, their median, still in it)
            if key[1] is not None:
                # the same peers for every member still in it: their median once per instance, not once
                # per member (65,536 members of one step would make that a square)
                shared = (*(index.median(role, (key,)) if fin else (0, 0.0)), len(members))
            else:
                n_fin = sum(len(finished.get(k, ())) for k in _neighbours(key))
                still = sum(len(by_key.get(k, ())) for k in _neighbours(key))
                if n_fin > EXACT_UP_TO:
                    # a stepless call of thousands (every worker's init): the peers that finished a call that
                    # began within the same or a neighbouring window, once per window
                    shared = (*index.median(role, tuple(_neighbours(key))), still)
                elif n_fin < still - 1:
                    # fewer finished than half of anyone's peers: nobody is judged by them (n >= ceil((n + s - 1)
                    # / 2) needs n >= s - 1), each by its own history
                    shared = (0, 0.0, still)
            if shared is None:  # a small stepless call: each member's own peers
                exact = [w for w in members.values() if now - w.phase_since > MIN_S]
            elif key[1] is not None and fin:  # a member among the finished too (a phase again): not its own peer
                exact = [members[src] for src in members.keys() & fin.keys() if now - members[src].phase_since > MIN_S]
            else:
                exact = []
            for w in exact:
                _judge([w], *_exact_peers(w, key, finished, by_key), now, index, named, own)
            if shared is not None:
                _judge_all(members, {w.src for w in exact}, bounds, *shared, now, index, named, own)
    if named:  # the rest are waiting for them
        return index.in_order(named, state)
    return _not_the_waiting(state, index.in_order(own, state))


def _judge(ws: list[WorkerState], n_done: int, med: float, still: int, now: float, index: SpanIndex,
           named: list[Late], own: list[Late]) -> None:
    """Late or not, the members ``ws`` of one instance who share its peers: by the peers once at least half
    of them finished, else each by its own history."""
    peers = n_done + still - 1
    if n_done and n_done >= max(1, math.ceil(peers / 2)):
        thr = max(MIN_S, PEER_FACTOR * med)
        for w in ws:
            elapsed = now - w.phase_since
            if elapsed > thr:
                named.append(Late(w.src, w.phase, w.phase_step, elapsed, thr, med, n_done, peers, "peers",
                                  "critical" if elapsed > 2 * thr else "warn"))
        return
    own_of = index.own
    for w in ws:
        thr, n_own, med = own_of[w.src]
        elapsed = now - w.phase_since
        if elapsed > thr:
            own.append(Late(w.src, w.phase, w.phase_step, elapsed, thr, med, n_own, n_own, "own", "warn"))


def _judge_all(members: dict[str, WorkerState], apart: set[str], bounds: list[float], n_done: int, med: float,
               still: int, now: float, index: SpanIndex, named: list[Late], own: list[Late]) -> None:
    """``_judge`` for the members of an instance that share its peers (all but ``apart``), reading them
    only when the instance's bounds say one of them may be late; the bounds are made exact on the way."""
    peers = n_done + still - 1
    if n_done and n_done >= max(1, math.ceil(peers / 2)):
        if now - bounds[0] <= max(MIN_S, PEER_FACTOR * med):
            return
    elif now < bounds[1]:  # (strict: at now == phase_since + thr exactly, now - phase_since may exceed thr)
        return
    ws = [w for src, w in members.items() if src not in apart and now - w.phase_since > MIN_S]
    _judge(ws, n_done, med, still, now, index, named, own)
    own_of = index.own
    bounds[0] = min(w.phase_since for w in members.values())
    bounds[1] = min(w.phase_since + own_of[src][0] for src, w in members.items())


def _exact_peers(w: WorkerState, key: tuple, finished: dict, by_key: dict) -> tuple[int, float, int]:
    """(finished, their median, still in it) of ``w``'s own peers: every other worker that finished its
    instance (a stepless call: one that began within SAME_CALL_S of it)."""
    done: dict[str, float] = {}
    still = 0
    for k in _neighbours(key):
        for src, (started, dur) in finished.get(k, {}).items():
            if src != w.src and (key[1] is not None or abs(started - w.phase_since) <= SAME_CALL_S):
                done[src] = dur
        still += len(by_key.get(k, ()))
    return len(done), statistics.median(done.values()) if done else 0.0, still


def _not_the_waiting(state: RunState, own: list[Late]) -> list[Late]:
    """Own-history findings that share one instance of a phase are a group waiting on each other:
    the driver waits on everyone, and in a weight sync the driver's own pending list says who holds
    the broadcast up (the root is blocked by them). Without such a list, all of them stay named."""
    by_instance: dict[tuple, list[Late]] = {}
    for late in own:
        by_instance.setdefault((late.phase, late.step), []).append(late)
    out = []
    for (phase, _), group in by_instance.items():
        if len(group) > 1:
            group = [g for g in group if state.workers[g.src].role != "driver"] or group
            pending = set(state.sync.pending) if phase == "sync_weights" and state.sync is not None else set()
            group = [g for g in group if g.src in pending] or group
        out += group
    return out
