"""A worker slower than its peers step after step: not stuck, and under any deadline, but every step waits for it.

A weaker or throttled device, a node shared with another job, a degraded link: one rollout of several takes three
times as long to generate, every step, and the step takes as long as its slowest member. The straggler rule does
not see it (it names a member late by 5 s at least, so that a step's noise is never called a stall); this rule
reads the steps that ended instead. In each finished instance of a phase of a role (the same phase at the same step,
every member out of it), a member whose time was ``SLOW_RATIO`` times its peers' median or more was slow in it;
one slow in ``SLOW_IN`` of the role's last ``OF_LAST`` instances of a phase is named, with its median time and its
peers'. A role of one has no peers: its own history is the straggler rule's.

It costs what ended, not what exists: an instance is judged once, when a pass first finds its last member out of
it, and a pass counts the slow members of each role's last instances.
"""

from __future__ import annotations

import statistics
from typing import NamedTuple

from gkd_core.diagnosis import stragglers
from gkd_core.diagnosis.stragglers import SpanIndex
from gkd_core.state import RunState

# its time over its peers' median: three times slower is a ratio of 3. Under it, the noise of a busy node: steps of
# milliseconds on two shared cores put one rollout at twice the other's time, a few steps in a row, now and then
SLOW_RATIO = 2.5
SLOW_IN, OF_LAST = 6, 8  # slow in this many of the role's last instances of a phase
WARM_UP = 4  # the first instances of a phase after the run (re)started are not judged: new processes warm up
PEERS_EXACT_UP_TO = 16  # a member's peers' median is of the others, exactly, up to this many members
MIN_PEER_S = 0.002  # instances whose peers took less than this (a phase that is a few calls) are noise, not judged


class Slow(NamedTuple):
    src: str
    role: str
    phase: str
    slow_in: int  # instances of its last OF_LAST it was slow in
    of: int  # its instances among the role's last OF_LAST
    took: float  # its median time in the instances it was slow in
    peers: float  # its peers' median time in those


class SlowIndex:
    """Each finished instance's slow members, judged once, when it is first seen with every member out of it, and
    kept for the role's last ``OF_LAST`` instances of each phase (the straggler index keeps a worker's last spans
    only: a few steps of a phase, where every step has several)."""

    def __init__(self) -> None:
        # (role, phase) -> step -> ({member: (its time, its peers' median)} of the slow ones, the members that ran it)
        self.history: dict[tuple[str, str], dict[int, tuple[dict[str, tuple[float, float]], frozenset[str]]]] = {}
        self.warming: dict[tuple[str, str], set[int]] = {}  # (role, phase) -> the steps passed over while warming up
        self.since = 0.0  # the run's start these are of: a restart's steps begin anew (from its checkpoint)

    def slow_workers(self, index: SpanIndex, running_since: float) -> list[Slow]:
        if running_since != self.since:
            type(self).__init__(self)
            self.since = running_since
        out = []
        for role, by_instance in index.finished.items():
            if index.role_size.get(role, 0) < 2:
                continue
            at_work = index.at_work.get(role, {})
            for key, members in by_instance.items():
                step = key[1]
                if not isinstance(step, int) or key in at_work or len(members) < 2:
                    continue  # no step's instance, one a member is still in, or one with no peers
                judged = self.history.setdefault((role, key[0]), {})
                warming = self.warming.setdefault((role, key[0]), set())
                if step in judged or step in warming or (len(judged) >= OF_LAST and step < min(judged)):
                    continue  # (judged once: the walk of its members below is not taken again, pass after pass)
                if any(started < running_since for started, _ in members.values()):
                    continue  # spans of the run before a restart (a worker keeps its spans across one)
                if len(warming) < WARM_UP:
                    warming.add(step)
                    continue
                judged[step] = _judge(members)
                if len(judged) > OF_LAST:
                    del judged[min(judged)]
        for (role, phase), judged in self.history.items():
            out += _named(role, phase, list(judged.values()))
        return out


def _judge(members: dict[str, tuple[float, float]]) -> tuple[dict[str, tuple[float, float]], frozenset[str]]:
    """The slow members of one instance ({member: (started, its time)}), with their times and their peers'."""
    times = {src: dur for src, (_, dur) in members.items()}
    ordered = sorted(times.values())
    everyone = statistics.median(ordered)
    many = len(times) > PEERS_EXACT_UP_TO
    slow: dict[str, tuple[float, float]] = {}
    for src, took in times.items():
        if took < SLOW_RATIO * MIN_PEER_S or (many and took < SLOW_RATIO * everyone):
            continue
        peers = everyone if many else _median_without(ordered, took)
        if peers >= MIN_PEER_S and took >= SLOW_RATIO * peers:
            slow[src] = (took, peers)
    return slow, frozenset(times)


def _named(role: str, phase: str, instances: list[tuple[dict[str, tuple[float, float]], frozenset[str]]]
           ) -> list[Slow]:
    counts: dict[str, list[tuple[float, float]]] = {}
    for slow, _ in instances:
        for src, pair in slow.items():
            counts.setdefault(src, []).append(pair)
    out = []
    for src, pairs in counts.items():
        if len(pairs) >= SLOW_IN:
            ran = sum(src in members for _, members in instances)
            out.append(Slow(src, role, phase, len(pairs), ran, statistics.median(t for t, _ in pairs),
                            statistics.median(p for _, p in pairs)))
    return out


def _median_without(ordered: list[float], value: float) -> float:
    """The median of ``ordered`` (sorted) without one ``value`` of it."""
    rest = list(ordered)
    rest.remove(value)
    return statistics.median(rest)


def slow_workers(state: RunState) -> list[Slow]:
    """The workers of ``state`` slower than their peers step after step (its index kept beside its straggler
    index, whose lock it shares, for as long as the state lives)."""
    index, lock = stragglers.index_of(state)
    slow = state.kept("slow_peers", SlowIndex)
    with lock:
        index.update(state)
        return slow.slow_workers(index, state.running_since)
