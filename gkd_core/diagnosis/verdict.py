"""Stuck or slow: "how do I know it is really stuck?", answered from the
heartbeats' CPU share and two stacks taken a few seconds apart.

- dead: Ray says its actor is DEAD;
- frozen: silent as long as the liveness judge calls frozen (``state.liveness``: the Reporter thread is stopped
  too: SIGSTOP, D state, the GIL held in C);
- silent: not heard from lately, not frozen yet (or nothing else is heard from either);
- stuck: no CPU progress and the same stack twice;
- busy: the CPU is used and the stack changes;
- waiting: little CPU but the stack moves (a slow peer, network, disk).
"""

from __future__ import annotations

from typing import NamedTuple

from gkd_core.stack_text import signature, where
from gkd_core.state import RunState, WorkerState
from gkd_core.state.liveness import DEAD, FROZEN, LATE, Limits, judge, others_heard

NO_PROGRESS_S = 5.0
BUSY_PCT = 50.0


class Verdict(NamedTuple):
    word: str  # dead, frozen, silent, stuck, busy, waiting, or "" while there is nothing to go on
    text: str
    where: str  # the stack line, when a stack was taken during this phase


def verdict(state: RunState, w: WorkerState, now: float, limits: Limits) -> Verdict:
    cur, prev = state.stacks.get(w.src), state.stacks_prev.get(w.src)
    cur = cur if cur is not None and cur.ts >= w.phase_since and cur.text else None
    prev = prev if cur is not None and prev is not None and prev.ts >= w.phase_since and prev.text else None
    line = where(cur.text) if cur else ""
    two = prev is not None
    same = cur is not None and prev is not None and signature(cur.text) == signature(prev.text)
    suffix = f", {line}" if line.startswith("in ") else f", in {line}" if line else ""  # ("in epoll_wait", alone)
    alive = judge(state, w, now, limits)
    if alive.word == DEAD:
        return Verdict("dead", "dead: Ray reports its actor DEAD" + (f" ({w.ray_death_cause[:120]})"
                                                                    if w.ray_death_cause else ""), line)
    if alive.word == FROZEN:
        return Verdict("frozen", f"frozen: no heartbeat for {alive.silent_s:.0f} s (SIGSTOP, D state or the GIL held "
                                 "in C)" + suffix, line)
    if alive.word == LATE:  # its numbers are old: what it does now is not known
        alone = others_heard(state, now, limits)
        return Verdict("silent", f"silent: no heartbeat for {alive.silent_s:.0f} s" + (
            "" if alone else ", nor from any other process (the path to the supervisor, or the supervisor?)")
            + suffix, line)
    low = now - w.cpu_low_since if w.cpu_low_since is not None else 0.0
    if low >= NO_PROGRESS_S and (same or not two):
        return Verdict("stuck", f"stuck: no CPU progress for {low:.0f} s"
                       + (", the same stack twice" if same else "") + suffix, line)
    if w.cpu >= BUSY_PCT:
        return Verdict("busy", f"busy: {w.cpu:.0f} % CPU" + (", stack changing" if two and not same else "")
                       + suffix, line)
    if two:
        return Verdict("waiting", f"waiting: {w.cpu:.0f} % CPU, stack changing" + suffix, line)
    return Verdict("", f"{w.cpu:.0f} % CPU" + suffix, line)
