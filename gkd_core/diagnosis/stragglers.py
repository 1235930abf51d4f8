"""Who is late, named by its peers rather than by a deadline.

Workers of one role (one actor class) that run the same instance of a phase (the same phase at
the same step, or in Ray-only mode the same method called within a few seconds) form a group.
Once at least half of a member's peers have finished that instance, the member still in it is
late when its time exceeds max(5 s, 3x the median of its peers' times); critical at twice that.
A worker with no such peers is compared with its own history: max(5 s, 5x its median for that
phase) is "slower than usual". The root blocked by a straggler (the broadcasting student, the
driver waiting in ``ray.get``) is never named: it has no peers in its role, and its own-history
finding gives way while a peer-named straggler is late.
"""

from __future__ import annotations

import math
import statistics
from typing import NamedTuple

from gkd_core.state import TERMINAL_PHASES, RunState, WorkerState

MIN_S = 5.0
PEER_FACTOR = 3.0
OWN_FACTOR = 5.0
OWN_MIN_SAMPLES = 3
SAME_CALL_S = 5.0  # phases without a step: started within this of each other is the same call
EXACT_UP_TO = 256  # more finished peers than this in a stepless call's windows: counted once per window
NOT_WORK = frozenset({"", "idle", "serve", "ready", "watching", *TERMINAL_PHASES})


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


def _instance(phase: str, step: int | None, started: float) -> tuple:
    return (phase, step) if step is not None else (phase, None, math.floor(started / SAME_CALL_S))


def _neighbours(key: tuple) -> list[tuple]:
    if key[1] is not None:
        return [key]
    return [key, (key[0], None, key[2] - 1), (key[0], None, key[2] + 1)]


def _finished_by_instance(members: list[WorkerState]) -> dict[tuple, dict[str, tuple[float, float]]]:
    """instance -> {worker: (started, duration)} of the finished spans of one role (newest wins)."""
    out: dict[tuple, dict[str, tuple[float, float]]] = {}
    for w in members:
        for s in w.spans:
            if s.phase in NOT_WORK:
                continue
            out.setdefault(_instance(s.phase, s.step, s.started), {})[w.src] = (s.started, s.ended - s.started)
    return out


def late_workers(state: RunState, now: float) -> list[Late]:
    by_role: dict[str, list[WorkerState]] = {}
    for w in state.workers.values():
        by_role.setdefault(w.role or w.src, []).append(w)
    named: list[Late] = []
    own: list[Late] = []
    for members in by_role.values():
        running = [w for w in members if w.phase not in NOT_WORK and now - w.phase_since > MIN_S]
        if not running:
            continue
        finished = _finished_by_instance(members) if len(members) > 1 else {}
        in_phase: dict[tuple, int] = {}
        for w in members:
            if w.phase not in NOT_WORK:
                key = _instance(w.phase, w.phase_step, w.phase_since)
                in_phase[key] = in_phase.get(key, 0) + 1
        shared: dict[tuple, tuple[int, float, int]] = {}  # an instance -> (finished, their median, still in it)
        for w in running:
            elapsed = now - w.phase_since
            key = _instance(w.phase, w.phase_step, w.phase_since)
            fin = finished.get(key, {})
            if key in shared and w.src not in fin:
                n_done, med, still = shared[key]
            elif key[1] is not None and w.src not in fin:
                # the same peers for every member still in it: their median once per instance, not once
                # per member (65,536 members of one step would make that a square)
                durs = [dur for _, dur in fin.values()]
                n_done, med, still = shared[key] = (len(durs), statistics.median(durs) if durs else 0.0,
                                                    in_phase.get(key, 0))
            elif key[1] is None and sum(len(finished.get(k, ())) for k in _neighbours(key)) > EXACT_UP_TO:
                # a stepless call of thousands (every worker's init): the peers that finished a call that
                # began within the same or a neighbouring window, once per window
                durs = [dur for k in _neighbours(key) for _, dur in finished.get(k, {}).values()]
                n_done, med, still = shared[key] = (len(durs), statistics.median(durs),
                                                    sum(in_phase.get(k, 0) for k in _neighbours(key)))
            else:
                done: dict[str, float] = {}
                still = 0
                for k in _neighbours(key):
                    for src, (started, dur) in finished.get(k, {}).items():
                        if src != w.src and (w.phase_step is not None or abs(started - w.phase_since) <= SAME_CALL_S):
                            done[src] = dur
                    still += in_phase.get(k, 0)
                n_done, med = len(done), statistics.median(done.values()) if done else 0.0
            peers = n_done + still - 1
            if n_done and n_done >= max(1, math.ceil(peers / 2)):
                thr = max(MIN_S, PEER_FACTOR * med)
                if elapsed > thr:
                    named.append(Late(w.src, w.phase, w.phase_step, elapsed, thr, med, n_done, peers, "peers",
                                      "critical" if elapsed > 2 * thr else "warn"))
                continue
            hist = [s.ended - s.started for s in w.spans if s.phase == w.phase]
            if len(hist) >= OWN_MIN_SAMPLES:
                med = statistics.median(hist)
                thr = max(MIN_S, OWN_FACTOR * med)
                if elapsed > thr:
                    own.append(Late(w.src, w.phase, w.phase_step, elapsed, thr, med, len(hist), len(hist), "own",
                                    "warn"))
    if named:  # the rest are waiting for them
        return named
    return _not_the_waiting(state, own)


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
