"""Is a worker alive? The one judge of it, which the diagnosis's rules (``heartbeat_stale``, the straggler's
and the teacher's verdicts, ``no_progress``), the stuck-or-slow verdict and the dashboard's rows all ask.

A worker is judged by how long since it was last heard from (``views.heartbeat_at``: its own beat, or its
relay's clock while that vouches for it; or the start of its phase, which it says through the same thread):

- dead: Ray says its actor is DEAD;
- ended: it said it finished, failed, was cancelled or exited (not for this judge: its phase says it);
- frozen: silent for ``stall_s``; or for ``frozen_s`` while others are still heard from: then the path and
  the supervisor work, and it is this process (SIGSTOP, D state, the GIL held in C) whose heartbeat
  thread, which waits with the GIL released, has not run for that many of its periods;
- late: silent for more than ``fresh_s`` (three beats): not frozen yet;
- alive: heard from lately, or never heard from (not started: a silence counts from a first word).

Whether others are heard from is one number the reducer keeps (``RunRecord.newest_beat``), so a judgement
costs the same at eight workers as at 65,536; a walk over every worker (``silent_among``) passes over those
heard from lately at the cost of a few comparisons, and asks ``silence`` of the rest.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from gkd_core.state.records import WorkerState
from gkd_core.state.run_record import RunRecord
from gkd_core.state.views import heard_from
from gkd_core.vocab import WORKER_ENDED

ALIVE, LATE, FROZEN, DEAD, ENDED = "alive", "late", "frozen", "dead", "ended"

FRESH_BEATS = 3  # a heartbeat younger than this many periods (and FRESH_MIN_S) is fresh
FRESH_MIN_S = 3.0
FROZEN_S = 5.0  # a silence this long (at least FRESH_BEATS periods) while others beat: the process has stopped


class Limits(NamedTuple):
    """A run's periods, from which the judge's thresholds follow."""

    heartbeat_s: float = 1.0  # how often a worker sends a heartbeat
    stall_s: float = 10.0  # a silence this long is frozen whatever else is heard

    @property
    def fresh_s(self) -> float:
        return max(FRESH_MIN_S, FRESH_BEATS * self.heartbeat_s)

    @property
    def frozen_s(self) -> float:
        return max(FROZEN_S, FRESH_BEATS * self.heartbeat_s)

    def shortest(self, least: str) -> float:
        """The shortest silence that can be called ``least`` (LATE or FROZEN), whoever else is heard: a walk
        over many workers may pass over one whose own newest beat is younger (its relay's clock and its
        phase's start can only make it younger still)."""
        frozen = min(self.frozen_s, self.stall_s)
        return frozen if least == FROZEN else min(self.fresh_s, frozen)


class Judged(NamedTuple):
    word: str  # ALIVE, LATE, FROZEN, DEAD or ENDED
    silent_s: float | None  # since it was last heard from; None: never heard from


def others_heard(st: RunRecord, now: float, limits: Limits) -> bool:
    """Is any process of the run heard from lately (a heartbeat or a relay's clock younger than ``fresh_s``)?"""
    return st.newest_beat > now - limits.fresh_s


def judge(st: RunRecord, w: WorkerState, now: float, limits: Limits, others: bool | None = None) -> Judged:
    """``w``'s liveness at ``now``: dead or ended as it or Ray said, else as its silence says (``silence``)."""
    if w.ray_state == "DEAD":
        return Judged(DEAD, None)
    if w.phase in WORKER_ENDED:
        return Judged(ENDED, None)
    return silence(st, w, now, limits, others)


def silence(st: RunRecord, w: WorkerState, now: float, limits: Limits, others: bool | None = None) -> Judged:
    """What ``w``'s silence says at ``now``: alive, late or frozen, whatever Ray says of it (the stale
    heartbeat's rule names a silent worker whose actor died too). ``others``: whether others are heard from,
    when the caller knows it for a whole walk (``others_heard``); asked of the state otherwise."""
    heard = heard_from(st, w)
    if not heard:
        return Judged(ALIVE, None)
    silent = now - heard
    if silent > limits.stall_s:
        return Judged(FROZEN, silent)
    if silent > limits.frozen_s and (others if others is not None else others_heard(st, now, limits)):
        return Judged(FROZEN, silent)
    if silent > limits.fresh_s:
        return Judged(LATE, silent)
    return Judged(ALIVE, silent)


def silent_among(st: RunRecord, workers: Iterable[WorkerState], now: float, limits: Limits,
                 least: str = LATE) -> list[tuple[WorkerState, Judged]]:
    """Those of ``workers`` not ended whose ``silence`` is ``least`` (LATE or FROZEN) or worse, with it. Written
    for a walk over all of a large run's workers (65,536 at the largest, each pass of the rules, each rebuild
    of the dashboard's table): a worker heard from too lately for that (``heard_from``, inline: its own beat,
    its relay's clock as far as it vouches, its phase's start) costs a few comparisons, not a call."""
    others = others_heard(st, now, limits)
    before = now - (limits.stall_s if least == FROZEN and not others else limits.shortest(least))
    clocks, vouch = st.relay_clocks, st.vouch_s
    out = []
    for w in workers:
        beat = w.last_heartbeat
        if not beat or beat >= before:
            continue  # never heard from, or its own beat is young enough
        if w.clock_via and (clock := clocks.get(w.clock_via)) is not None and clock[1] > beat:
            if (clock[1] if clock[1] < beat + vouch else beat + vouch) >= before:
                continue
        if w.phase_since >= before or w.phase in WORKER_ENDED:
            continue
        said = silence(st, w, now, limits, others)
        if said.word == FROZEN or (said.word == LATE and least == LATE):
            out.append((w, said))
    return out
