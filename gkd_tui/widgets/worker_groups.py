"""The workers table's rows: a group per role with its counts, what is wrong first.

At 8 workers and at 65,536 the table reads the same way: the groups that hold a straggler, a stale
heartbeat, a dead or failed worker come first, and under each group's line its troubled workers,
worst first, whether the group is open or not. A group of up to ``OPEN_UP_TO`` workers is open (its
other workers follow); a larger one shows its line ("rollout × 65,532: 65,530 generate · 2
stragglers") until enter opens it. A worker alone in its role (the driver, the student) is a row
of its own, without a group line. A filter shows every worker it matches, by name, phase, node or
pid, in any group.

One pass over the workers builds it (about 0.5 µs a worker alone, two or three times that on a busy
machine): the table rebuilds at most once a second, a large run's in slices (``Pass``), and each redraw
reads the rows on screen straight from the state.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from gkd_core import vocab
from gkd_core.state import AlertState, RunState, WorkerState
from gkd_core.state.liveness import DEAD, FROZEN, Limits, judge, silent_among
from gkd_core.vocab import SEVERITY_ORDER, WORKER_ENDED
from gkd_tui.widgets.styles import CAUTION, FAILURE, NAMED_ROW, TROUBLE

OPEN_UP_TO = 16  # a group this small is open by itself
ROLE_ORDER = {"driver": 0, "student": 1, "rollout": 2, "teacher": 3, "agent": 4}
# what the most severe alert naming a worker says it is, in a word
CODE_WORD = {code: k.word for code, k in vocab.ALERTS.items() if k.word}
PLURAL = {"straggler": "stragglers"}


@dataclass
class Group:
    role: str
    n: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    trouble: list[tuple[tuple, str, str]] = field(default_factory=list)  # (sort key, src, word), worst first
    members: list[WorkerState] = field(default_factory=list)  # the others (while the rows are built)
    open: bool = False

    @property
    def key(self) -> str:
        return f"group:{self.role}"

    @property
    def worst(self) -> int:
        return self.trouble[0][0][0] if self.trouble else 9

    def summary(self) -> str:
        """ "2 stragglers · 59,998 generate · 2 teacher_wait": what is wrong first, then the phases"""
        words: dict[str, int] = {}
        for _, _, word in self.trouble:
            words[word] = words.get(word, 0) + 1
        parts = [f"{n:,} {PLURAL.get(w, w) if n > 1 else w}" for w, n in words.items()]
        phases = sorted(self.phases.items(), key=lambda kv: -kv[1])
        parts += [f"{n:,} {p or '-'}" for p, n in phases[:4]]
        if len(phases) > 4:
            parts.append(f"{sum(n for _, n in phases[4:]):,} other")
        return " · ".join(parts)


def worst_alerts(st: RunState) -> dict[str, AlertState]:
    """worker -> the most severe active alert that names it."""
    out: dict[str, AlertState] = {}
    for a in st.alerts.values():
        for t in a.targets:
            if t not in out or SEVERITY_ORDER.get(a.severity, 3) < SEVERITY_ORDER.get(out[t].severity, 3):
                out[t] = a
    return out


def trouble(st: RunState, w: WorkerState, alert: AlertState | None, now: float,
            limits: Limits) -> tuple[int, str, str] | None:
    """(how bad: 0 worst, the word for it, its row's style) of a worker something is wrong with;
    None if nothing is. The one place that says so, for the group's counts and order and for the row;
    whether it is alive, the liveness judge's (``state.liveness``)."""
    if w.phase in WORKER_ENDED:
        return (0, "failed", FAILURE) if w.phase == "failed" else None
    alive = judge(st, w, now, limits)
    if alive.word == DEAD:  # Ray says so, whatever its last heartbeat said
        return 0, "dead", TROUBLE
    if alert is not None and alert.severity in NAMED_ROW:  # a straggler, a frozen or an out-of-memory worker
        return (0 if alert.severity == "critical" else 1), CODE_WORD.get(alert.code, alert.code), \
            NAMED_ROW[alert.severity]
    if alive.word == FROZEN:  # (in the word of the alert that names it so, which may be on its way)
        return 1, CODE_WORD["heartbeat_stale"], TROUBLE
    if w.deadline and now > w.deadline - 0.2 * max(1.0, w.deadline - w.phase_since):
        return 2, "near deadline", CAUTION
    return None


def sort_key(w: WorkerState):
    return (w.role, w.rank if w.rank is not None else -1, w.src)


def matches(w: WorkerState, text: str) -> bool:
    return text in f"{w.src} {w.phase} {w.node} {w.pid}"


def build(st: RunState, now: float, limits: Limits, toggled: frozenset[str] | set[str] = frozenset(),
          filter_text: str = "") -> list[tuple]:
    """The rows, in order: ``("group", Group)`` or ``("worker", src)``. ``toggled``: the keys of the
    groups enter opened (or closed, for a small one)."""
    one = Pass(st, limits, toggled, filter_text)
    one.take(now)
    return one.rows()


class Pass:
    """One pass over the workers, which makes the rows: whole (``build``), or a slice at a time. A large
    run's table takes a slice a redraw (WorkersTable), so that no redraw holds the state for a whole pass:
    at 65,536 workers on a busy 2-core machine that was 60-150 ms, the slowest part of a phase change's way
    to the screen (bench/bench_dashboard.py). A worker that joins during a pass is in the next one."""

    def __init__(self, st: RunState, limits: Limits, toggled: frozenset[str] | set[str] = frozenset(),
                 filter_text: str = ""):
        self.st, self.limits, self.filter_text = st, limits, filter_text
        self.toggled = frozenset(toggled)
        self.named = worst_alerts(st)
        self.groups: dict[str, Group] = {}
        self._workers = list(st.workers.values())  # as they were when it began
        self._next = 0

    @property
    def done(self) -> bool:
        return self._next >= len(self._workers)

    def take(self, now: float, n: int | None = None) -> None:
        """The next ``n`` workers (all that are left: None), judged at ``now``."""
        end = len(self._workers) if n is None else min(len(self._workers), self._next + n)
        st, named, groups, filter_text = self.st, self.named, self.groups, self.filter_text
        frozen = {w.src for w, _ in silent_among(st, itertools.islice(self._workers, self._next, end), now,
                                                 self.limits, FROZEN)}
        for w in itertools.islice(self._workers, self._next, end):
            if filter_text and not matches(w, filter_text):
                continue
            role = w.role or w.src
            g = groups.get(role)
            if g is None:
                g = groups[role] = Group(role)
            g.n += 1
            g.phases[w.phase] = g.phases.get(w.phase, 0) + 1
            # the common case in one test: no alert, not terminal, heartbeat fresh, no deadline
            if w.src in named or w.phase in WORKER_ENDED or w.ray_state == "DEAD" or w.deadline or w.src in frozen:
                why = trouble(st, w, named.get(w.src), now, self.limits)
                if why is not None:
                    g.trouble.append(((why[0], *sort_key(w)), w.src, why[1]))
                    continue
            g.members.append(w)
        self._next = end

    def rows(self) -> list[tuple]:
        """The rows of the workers taken so far (all of them, once ``done``); asked once: it empties the groups."""
        order = sorted(self.groups.values(), key=lambda g: (g.worst, ROLE_ORDER.get(g.role, 9), g.role))
        rows: list[tuple] = []
        for g in order:
            g.trouble.sort()
            g.open = bool(self.filter_text) or (g.n <= OPEN_UP_TO) != (g.key in self.toggled)
            if g.n > 1:
                rows.append(("group", g))
            rows += [("worker", src) for _, src, _ in g.trouble]
            if g.open or g.n == 1:
                rows += [("worker", w.src) for w in sorted(g.members, key=sort_key)]
            g.members = []  # the rows hold what is shown; the group need not keep 65,536 workers
        return rows
