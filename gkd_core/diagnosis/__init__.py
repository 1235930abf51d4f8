"""Diagnosis: rules that turn a RunState into findings, in seconds rather than at a deadline.

``diagnose(state, now)`` runs every rule in ``rules.RULES`` (``Pass`` takes them in turns, as the supervisor
does); each is a function of the RunState and ``now`` returning alerts with their evidence and hint. A rule
costs what changed since the last pass, not the size of the run: the indexes it keeps of the state between
passes (stragglers, marks, memory growth, the GPUs) read what the state fed them (``state.feed``) and what
came due, and change no finding. ``changes`` turns the findings into the alert events that move the state to
them, and ``AutoStacks`` says whose stacks to take. The supervisor runs them for gkd runs, the Ray-state source
for jobs it only observes (DESIGN §4).
"""

from __future__ import annotations

import math
import time

from gkd_core import vocab
from gkd_core.diagnosis import cascade, stragglers
from gkd_core.diagnosis.gpu_index import GpuIndex
from gkd_core.diagnosis.marks import Marks
from gkd_core.diagnosis.memory_growth import GrowthIndex
from gkd_core.diagnosis.rules import CODES, LIVE, RULES, Settings, parts_explain, still_cycles, waits
from gkd_core.diagnosis.rules.memory import LowNodes
from gkd_core.state import AlertState, RunState, alert_key
from gkd_core.state.beat_table import BEAT_TABLE, BeatTable
from gkd_core.telemetry.events import AlertEvent
from gkd_core.telemetry.evidence import elapsed_of

__all__ = ["CODES", "LIVE", "AutoStacks", "Pass", "Settings", "changes", "diagnose", "keep_up"]

# a worker named by one of these gets its stack taken at once and again AUTO_STACK_AGAIN_S later,
# with no key press, so that the alert can say "the same stack twice"
AUTO_STACK_CODES = vocab.codes(stacks=True)
AUTO_STACK_AGAIN_S = 3.0
DEFAULT_SETTINGS = Settings()  # (a NamedTuple: one default shared by every call is safe)


KEEP_UP_MOST = 1024  # workers each index takes in at a time between passes
KEEP_UP_S = 0.01  # and for this long a tick of the supervisor's loop, at the most, while they have some left


def keep_up(state: RunState, budget_s: float = KEEP_UP_S) -> None:
    """Between passes (each tick of the supervisor's loop) every index takes in slices of what the state fed it, for
    ``budget_s`` at the most: after a burst (131,072 workers' first beats and registrations, a step's phases) the
    pass finds little left to read, and no tick holds up the ingest for long. (Over a slice's time: the rest at the
    next tick; a round that takes in nothing ends it.)"""
    start = time.perf_counter()
    left = state.backlog()
    while True:
        _keep_up_once(state)
        was, left = left, state.backlog()
        if not left or left >= was or time.perf_counter() - start >= budget_s:
            return


def _keep_up_once(state: RunState) -> None:
    stragglers.keep_up(state)
    if isinstance(table := state.kept_if(BEAT_TABLE), BeatTable):
        table.keep_up(state, KEEP_UP_MOST)
    if isinstance(marks := state.kept_if("marks"), Marks):
        marks.keep_up(state, KEEP_UP_MOST)
    if isinstance(growth := state.kept_if("growth"), GrowthIndex):
        with growth.lock:
            growth.keep_up(state, KEEP_UP_MOST)
    if isinstance(low := state.kept_if("low_nodes"), LowNodes):
        low.keep_up(state, KEEP_UP_MOST)
    if isinstance(gpus := state.kept_if("gpu_index"), GpuIndex):
        gpus.keep_up(state, KEEP_UP_MOST)


def diagnose(state: RunState, now: float, settings: Settings = DEFAULT_SETTINGS) -> list[AlertEvent]:
    """What holds in ``state`` at ``now``: every rule, in one go (``Pass`` takes them in turns)."""
    return Pass(state, now, settings).turn() or []  # (a turn of no budget runs every rule)


class Pass:
    """One pass of the rules over a state at ``now``, taken in turns: a turn runs rules until its budget is spent
    (one rule at the least), and the supervisor reads its ingest between two turns, so that no event waits for a
    whole pass (a rule that costs what changed is short; a burst of changes is not). A rule reads the state as it
    is when the rule runs, with the pass's ``now``: a worker heard from since the pass began reads as fresh, as it
    will in the next pass."""

    def __init__(self, state: RunState, now: float, settings: Settings = DEFAULT_SETTINGS):
        self.state, self.now, self.settings = state, now, settings
        self._left = list(reversed(RULES))
        self._found: list[AlertEvent] = []
        self.took_s = 0.0  # its own time, over its turns
        self.turns = 0

    def turn(self, budget_s: float = math.inf) -> list[AlertEvent] | None:
        """Rules until ``budget_s`` (seconds) is spent; the pass's findings once every rule ran, else None."""
        start = time.perf_counter()
        self.turns += 1
        while self._left:
            rule = self._left.pop()
            self._found.extend(rule(self.state, self.now, self.settings))
            if self._left and time.perf_counter() - start >= budget_s:
                self.took_s += time.perf_counter() - start
                return None
        out = _pruned(self.state, self.now, self._found)
        self.took_s += time.perf_counter() - start
        return out


def _pruned(state: RunState, now: float, out: list[AlertEvent]) -> list[AlertEvent]:
    """The rules' findings, less what another explains, with whom each holds up."""
    out = parts_explain(out)  # a member slow in one part of a sync is that finding, not late in the sync too
    # the wait-for graph's cycles, found once a pass: a still one is a deadlock, and while one holds, its
    # members' and its waiters' lateness is its symptom, not a finding of their own; nor is the lateness of a
    # worker whose chain of waits ends in one another finding names (a rank that has not joined the
    # all-reduce because it waits on the queue, which waits on a server "slower than usual")
    found = waits.knots(state)
    out = waits.explained(out + still_cycles.deadlocks(state, now, found), found, state, now)
    # "slower than usual" is for when nothing else explains the wait: once a rule names a cause (a
    # straggler, a teacher that does not serve, a dead actor), the workers waiting on it are not named
    if any(a.targets and a.severity != "info" and a.code != "slower_than_usual" for a in out):
        out = [a for a in out if a.code != "slower_than_usual"]
    # the waiters along the graph's waits (a job whose processes say what they wait on; our trainer's peers in a
    # collective or on the teacher are the cascade's own)
    chains = (lambda causes: waits.waiting_on(found.graph, causes)) if state.waiting else None
    return cascade.with_blocked(state, out, chains)


def _changed(cur: AlertState, a: AlertEvent) -> bool:
    if cur.severity != a.severity:
        return True
    if a.code in LIVE:  # the time in the message grows every second: a change only when it has grown
        # by half (a log scale: 6, 9, 14, 20 s ...) or the verdict or the place changed
        # (2x > 3y, not x > 1.5y: exact for an integer of any size, where the float product overflows)
        grown = 2 * elapsed_of(a.evidence, 0.0) > 3 * elapsed_of(cur.evidence, math.inf)
        return grown or any(cur.evidence.get(k) != a.evidence.get(k) for k in ("verdict", "where", "blocked"))
    return cur.message != a.message or cur.evidence.get("blocked") != a.evidence.get("blocked")


def changes(state: RunState, wanted: list[AlertEvent]) -> list[AlertEvent]:
    """The alert events that move ``state.alerts`` to ``wanted``: new or changed findings, and a
    `cleared` one for each finding of these rules (CODES) that no longer holds."""
    out = []
    keys = set()
    for a in wanted:
        key = alert_key(a.code, a.targets)
        keys.add(key)
        cur = state.alerts.get(key)
        if cur is None or _changed(cur, a):
            out.append(a)
    for key, cur in state.alerts.items():
        if cur.code in CODES and key not in keys:
            out.append(AlertEvent(code=cur.code, targets=list(cur.targets), severity=cur.severity,
                                  message=cur.message, cleared=True))
    return out


class AutoStacks:
    """Whose stacks to take now: every worker an alert names, twice, AUTO_STACK_AGAIN_S apart, once
    per naming however often it changes phase. Taking them is the caller's (the supervisor asks the
    driver; the Ray-state source runs py-spy)."""

    def __init__(self) -> None:
        self._taken: dict[tuple[str, float], tuple[int, float]] = {}  # (worker, named since) -> (n, next)

    def due(self, state: RunState, mono: float) -> list[str]:
        first: dict[str, float] = {}
        for a in state.alerts.values():
            if a.code in AUTO_STACK_CODES:
                for t in a.targets:
                    first[t] = min(first.get(t, a.since), a.since)
        live, out = {}, []
        for t, since in first.items():
            if t not in state.workers:
                continue
            n, next_at = self._taken.get((t, since), (0, mono))
            if n < 2 and mono >= next_at:
                out.append(t)
                n, next_at = n + 1, mono + AUTO_STACK_AGAIN_S
            live[(t, since)] = (n, next_at)
        self._taken = live
        return out
