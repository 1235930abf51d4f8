"""The wait-for graph, its cycles, and the chains of waits that end in a worker another finding names.

Each worker's phase says what it waits on that has not answered (``waits_on``), and each is an edge:
an actor call (``Worker.method``: the ``ray.get`` of a watched job's driver or actor) to that worker, a
call queued behind the one it runs where the worker runs another method (an actor runs one call at a
time unless made otherwise); an HTTP request (``vocab.HttpWait``) to the worker whose process listens on
its address (by its pid on the sender's node, else by the addresses its served requests came to: a server on
another node); a wait on data (``vocab.DataWait``: a queue's get, a gate) to the workers that send the calls
that set it (``feeders_of``: their ``sends``). A rank inside a process group's newest collective waits on
the ranks that have not entered it. A cycle none of whose members has moved is said by still_cycles; the
workers whose waits lead into it are blocked by it, and nothing else names a member or a worker blocked by
it while the cycle holds (``explained``): the rank that has not joined, the driver "slower than usual",
are the cycle's symptoms. Likewise a waiter whose chain of waits ends in a worker another finding names.

What it cannot see: a ``ray.get`` off a process's main thread (a threaded actor's calls), a wait on a task
or on an object that no actor call of the job made, and an actor made with ``max_concurrency`` above one
that would run the queued call beside the running one (then the cycle moves, and is not named). A
``ray.wait`` that may return on the first of its refs is no edge (any one answer would end it).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import msgspec

from gkd_core.diagnosis.cascade import BLOCKED_MAX
from gkd_core.diagnosis.rules.servers import EXTERNAL_HINT, Servers, external_request, live
from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.telemetry.evidence import blocked_of
from gkd_core.units import spoken
from gkd_core.vocab import DataWait, HttpWait

STILL_S = MIN_S  # a cycle that has not moved for the straggler threshold is a deadlock
JUDGED_AFTER_S = MIN_S + 1.0  # a worker at work on a call this long has been judged by its own measure
CYCLES_MAX = 8  # cycles named at once (each is one alert)
CHAINS_MAX = 256  # findings whose chains of waits are followed in a pass (a whole cluster late is no chain)
CHAIN_MAX = 16  # hops followed from a waiter to the fresh work at its chain's end
WAIT_PHASES = ("ray.get", "ray.wait")  # a phase that is the wait itself (a driver's): named by its worker alone
# a collective is a node of the graph of its own (the ranks inside it wait on it, it waits on the ranks not
# in it): edges linear in the ranks, where each rank inside to each rank outside would be their product
COLLECTIVE = "\0collective "
# what a member of a cycle, or a worker blocked by one, is also found to be: symptoms of the cycle
EXPLAINED = ("straggler", "slower_than_usual", "collective_not_joined", "collective_stuck")


class Edge(NamedTuple):
    """One wait: an actor call not answered, or a collective not joined."""

    target: str  # the worker waited on (or a collective's node)
    what: str  # the method called on it; for a collective, "broadcast #3 of group default_pg"
    since: float  # when this wait began, as far as the state knows
    collective: bool = False
    request: bool = False  # an HTTP request in flight to the server ``target`` (what: its method, path, address)
    # a wait on data (a queue's get, a gate): for a call of the waiter's own method ``what``, which ``target``
    # sends (the waiter's queue is fed, or its gate opened, by those calls)
    data: bool = False


Hop = tuple[str, Edge]  # (the waiter, its edge to the next member)


def feeders_of(state: RunState) -> dict[str, list[str]]:
    """``Worker.method`` -> the workers that sent it lately (their ``sends``): who feeds a queue, who opens a
    gate, for a wait on data that a call of that method ends."""
    out: dict[str, list[str]] = {}
    for w in state.workers.values():
        for call in w.sends:
            out.setdefault(call, []).append(w.src)
    return out


def wait_graph(state: RunState) -> dict[str, list[Edge]]:
    """waiter -> what it waits on, for every live worker whose phase waits on a live worker of the run: its
    unanswered calls (``waits_on``), and each rank inside a process group's newest collective on the ranks
    that have not entered it (through the collective's own node)."""
    graph: dict[str, list[Edge]] = {}
    servers: Servers | None = None  # made once, for the first HTTP wait
    feeders: dict[str, list[str]] | None = None  # Worker.method -> who sends it: made once, for the first data wait
    for src in state.waiting:
        w = state.workers.get(src)
        if w is None or not w.waits_on or not live(state, src):
            continue
        for call in w.waits_on:
            data = DataWait.parse(call)
            if data is not None:  # on whoever sends the calls that set it: edges to each, none when nobody does
                if feeders is None:
                    feeders = feeders_of(state)
                for method in data.methods:
                    for sender in feeders.get(f"{w.src}.{method}", ()):
                        if sender != w.src and live(state, sender):
                            graph.setdefault(w.src, []).append(Edge(sender, method, max(w.phase_since, w.waits_since),
                                                                    data=True))
                continue
            request = HttpWait.parse(call)
            if request is not None:  # a request in flight: to the worker that listens there, if one of the run's
                if servers is None:
                    servers = Servers(state)
                worker = servers.of(w.node, request)
                method = request.route()
                if worker == w.src:
                    continue
            else:
                worker, _, method = call.rpartition(".")
            if live(state, worker):
                graph.setdefault(w.src, []).append(Edge(worker, method, max(w.phase_since, w.waits_since),
                                                        request=request is not None))
    for group, members in state.collectives.items():
        n = max((p.entered for p in members.values()), default=0)
        missing = sorted(src for src, p in members.items() if p.entered < n and live(state, src))
        if not missing:
            continue
        inside = [(src, p) for src, p in members.items() if p.entered == n and _inside(state, src, p)]
        if not inside:
            continue
        what = f"{next((p.op for _, p in inside if p.op), 'collective')} #{n} of group {group}"
        node = f"{COLLECTIVE}{what}"
        since = max(p.entered_at for _, p in inside)
        for src, p in inside:
            graph.setdefault(src, []).append(Edge(node, what, p.entered_at, collective=True))
        graph[node] = [Edge(m, what, since, collective=True) for m in missing]
    return graph


def _inside(state: RunState, src: str, p) -> bool:
    """Whether rank ``src`` is still inside the collective it entered last. Where its source cannot say it
    left (gloo, read from the Flight Recorder) it is taken to be inside only while it is still in the phase
    it entered the collective in: a rank whose broadcast returned and that went on to its next call is not."""
    if not live(state, src):
        return False
    if p.left is not None:
        return p.left < p.entered
    return state.workers[src].phase_since <= p.entered_at


def cycles(graph: dict[str, list[Edge]], limit: int = CYCLES_MAX) -> list[list[Hop]]:
    """Cycles with no member in common, at most ``limit``: one through the first back edge a depth-first
    search meets into each knot of waits (a cycle through a member of one already found is the same
    deadlock, said once). As hops ``(waiter, edge)`` in order. Each worker is entered once and a path is
    copied only for a cycle kept: linear in the edges, without recursion."""
    found: list[list[Hop]] = []
    taken: set[str] = set()
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[tuple[str, Edge | None]] = [(root, None)]  # (worker, the edge taken out of it)
        on_path = {root: 0}
        todo = [iter(graph.get(root, ()))]
        while todo:
            edge = next(todo[-1], None)
            if edge is None:  # every edge out of this worker followed
                worker, _ = path.pop()
                del on_path[worker]
                done.add(worker)
                todo.pop()
                continue
            path[-1] = (path[-1][0], edge)
            target = edge.target
            if target in on_path:  # back to a worker on the path: the hops from it to here are a cycle
                if target not in taken:
                    cycle = [(w, e) for w, e in path[on_path[target]:] if e is not None]
                    taken.update(w for w, _ in cycle)
                    found.append(cycle)
                    if len(found) >= limit:
                        return found
            elif target not in done:
                on_path[target] = len(path)
                path.append((target, None))
                todo.append(iter(graph.get(target, ())))
    return found


def _through_collectives(hops: list[Hop]) -> list[Hop]:
    """The hops between workers: a rank's edge into a collective's node and the node's edge out of it are one
    hop, the rank waiting on the next to join."""
    out: list[Hop] = []
    for i, (src, edge) in enumerate(hops):
        if src.startswith(COLLECTIVE):
            continue
        if edge.target.startswith(COLLECTIVE):
            onward = hops[(i + 1) % len(hops)][1]
            edge = Edge(onward.target, edge.what, max(edge.since, onward.since), collective=True)
        out.append((src, edge))
    return out


def waiting_on(graph: dict[str, list[Edge]], members: set[str]) -> set[str]:
    """The workers whose waits lead into ``members``, at any distance (``members`` not counted)."""
    waiters: dict[str, list[str]] = {}
    for src, edges in graph.items():
        for edge in edges:
            waiters.setdefault(edge.target, []).append(src)
    seen, todo = set(members), list(members)
    while todo:
        for src in waiters.get(todo.pop(), ()):
            if src not in seen:
                seen.add(src)
                todo.append(src)
    return {s for s in seen - members if not s.startswith(COLLECTIVE)}


class Knots(NamedTuple):
    """A pass's cycles of waits, still or not, and who is in or behind one."""

    graph: dict[str, list[Edge]]
    cycles: list[list[Hop]]  # between workers (a collective's node folded into its hop)
    held: set[str]  # every member of a cycle and every worker whose waits lead into one


def knots(state: RunState) -> Knots:
    graph = wait_graph(state)
    found = [_through_collectives(c) for c in cycles(graph)] if graph else []
    members = {src for c in found for src, _ in c}
    return Knots(graph, found, members | waiting_on(graph, members) if members else set())


def explained(alerts: list[AlertEvent], found: Knots, state: RunState | None = None,
              now: float = 0.0) -> list[AlertEvent]:
    """``alerts`` without what the waits explain: a finding of an EXPLAINED code all of whose targets are in
    a cycle or blocked by one (still or not: a cycle that moves again frees them), or that wait, along a
    chain of waits, on a worker another finding names. That worker is the cause, nearer the chain's end
    (the driver waits on Trainer/0.step, which waits on Inference/0.generate, named stuck): the waiters are
    its ``blocked``, as with a death, not late of their own. And, with ``state``: a finding whose targets
    each wait on a worker that has been at work on their call for less than ``JUDGED_AFTER_S`` (the
    straggler floor and a pass): that worker is judged first, by its own measure. A rollout begins its
    method a moment before the server begins the request it sends: without this, a pass between the two
    crossing the floor named the rollout first."""
    if found.held:
        alerts = [a for a in alerts if a.code not in EXPLAINED or not a.targets or not set(a.targets) <= found.held]
    if not found.graph:
        return alerts
    if state is not None:
        alerts = _to_external_ends(alerts, found.graph, state, now)
    named = {t: i for i, a in enumerate(alerts) if a.severity != "info" for t in a.targets}
    cause_of: dict[int, int] = {}  # a waiter's alert -> the alert naming the worker it waits on, nearest first
    for i, a in enumerate(alerts[:CHAINS_MAX]):
        if a.code in EXPLAINED and a.targets:
            causes = [_named_downstream(found.graph, t, named) for t in a.targets]
            known = [c for c in causes if c]
            if len(known) == len(causes) and len({named[c] for c in known}) == 1:
                cause_of[i] = named[known[0]]
    behind: dict[int, set[str]] = {}  # the alert at a chain's end -> every waiter along it
    resolved = set()  # the waiters' alerts whose chains end in a finding: dropped for it
    for i in cause_of:
        end, seen = cause_of[i], {i}
        while end in cause_of and end not in seen:  # a waiter's cause that waits itself: on to the end
            seen.add(end)
            end = cause_of[end]
        if end in cause_of:  # the chain came back on itself: no end to name, every finding kept
            continue
        behind.setdefault(end, set()).update(alerts[i].targets)
        resolved.add(i)
    out = []
    joining: dict[str, float] | None = None  # a rank a collective waits on -> since when (made at first need)
    for i, a in enumerate(alerts):
        if i in resolved:
            continue
        if state is not None and a.code in EXPLAINED and a.targets:
            if joining is None:
                joining = {e.target: e.since for node, edges in found.graph.items() if node.startswith(COLLECTIVE)
                           for e in edges}
            if all(_awaits_fresh_work(state, found.graph, t, now, joining) for t in a.targets):
                # its wait's end is at work on it, and not judged yet: held, and so are the waiters behind it
                # (the driver late on the rollout, the rollout on the server's request that began with it)
                continue
        if i in behind:
            blocked = sorted(set(blocked_of(a.evidence)) | behind[i])
            a = msgspec.structs.replace(a, evidence={**a.evidence, "blocked": blocked[:BLOCKED_MAX]})
        out.append(a)
    return out


def _to_external_ends(alerts: list[AlertEvent], graph: dict[str, list[Edge]], state: RunState,
                      now: float) -> list[AlertEvent]:
    """Each finding of an EXPLAINED code whose targets' chains of waits all end in one worker that waits on
    a server outside the job (a tool, a sandbox, an API), said of that worker instead (``external_wait``),
    with the finding's targets blocked by it: the queue "slower than usual" is waiting on its producer, and
    the producer on the tool that does not answer. One finding per such worker; the rest as they were."""
    ends: dict[str, list[AlertEvent]] = {}
    out: list[AlertEvent] = []
    named = {t for a in alerts for t in a.targets}
    for a in alerts:
        end = _chain_end(graph, a.targets) if a.code in EXPLAINED and a.targets and len(ends) < CHAINS_MAX else None
        if end is None and a.code in EXPLAINED and len(a.targets) == 1 and not graph.get(a.targets[0]):
            end = a.targets[0]  # a chain of none: the worker late itself waits on the server (slime's producer)
        w = state.workers.get(end) if end is not None and (end not in named or end in a.targets) else None
        if w is None or external_request(state, w) is None:
            out.append(a)
        else:
            ends.setdefault(w.src, []).append(a)
    for src, waiters in ends.items():
        w = state.workers[src]
        request = external_request(state, w)
        assert request is not None  # (found so above)
        since = max(w.phase_since, w.waits_since)
        before = [b for a in waiters for b in blocked_of(a.evidence)]
        blocked = sorted(({t for a in waiters for t in a.targets} | set(before)) - {src})
        said = w.detail.partition("waiting for ")[2] or request.spoken()
        led = (f", and the job's waits lead to it (from {', '.join(blocked[:3])}{' …' if len(blocked) > 3 else ''})"
               if blocked else "")
        out.append(AlertEvent(
            severity="critical" if any(a.severity == "critical" for a in waiters) else "warn", code="external_wait",
            targets=[src], hint=EXTERNAL_HINT,
            message=f"{src} has waited {spoken(now - since)} for {said}, a server outside the job{led}",
            evidence={"external": request.route(), "elapsed_s": round(now - since, 1), "blocked": blocked[:BLOCKED_MAX],
                      "found_as": sorted({a.code for a in waiters})}))
    return out


def _chain_end(graph: dict[str, list[Edge]], sources: list[str]) -> str | None:
    """The one worker that the waits of ``sources`` all lead to and that waits on nobody, or None (no chain,
    several ends, a cycle, or one longer than ``CHAIN_MAX`` hops)."""
    seen, todo, ends = set(sources), list(sources), set()
    for _ in range(CHAIN_MAX):
        nxt = []
        for src in todo:
            edges = graph.get(src, ())
            if not edges and src not in sources:
                ends.add(src)
            for edge in edges:
                if edge.target not in seen:
                    seen.add(edge.target)
                    nxt.append(edge.target)
        if not nxt:
            return ends.pop() if len(ends) == 1 and not next(iter(ends)).startswith(COLLECTIVE) else None
        todo = nxt
    return None


def _awaits_fresh_work(state: RunState, graph: dict[str, list[Edge]], src: str, now: float,
                       joining: dict[str, float], seen: frozenset[str] = frozenset()) -> bool:
    """Whether every wait of ``src`` is on a live worker at work on that very call (its phase is the method
    or the request's route) for less than ``JUDGED_AFTER_S``, or in a collective entered that recently (its
    own rule judges the rank that has not joined), or on one whose own waits are all so (a queue waits on its
    producer, which waits on a request a server began a moment ago; a driver waits on the trainer ranks, one
    of which waits in an all-reduce that another has not joined yet), or on a rank that such a collective
    waits on (``joining``: the collective's rule judges it)."""
    edges = list(graph.get(src, ()))
    for e in edges:
        if e.collective:
            if now - e.since >= JUDGED_AFTER_S:
                return False
            continue
        w = state.workers.get(e.target)
        if w is None or not live(state, e.target):
            return False
        doing = e.what.partition(" on ")[0] if e.request else e.what
        fresh = ((w.phase == doing and now - w.phase_since < JUDGED_AFTER_S)
                 or now - joining.get(e.target, -math.inf) < JUDGED_AFTER_S)
        if not fresh and (e.target in seen or len(seen) >= CHAIN_MAX
                          or not _awaits_fresh_work(state, graph, e.target, now, joining, seen | {src})):
            return False
    return bool(edges)


def _named_downstream(graph: dict[str, list[Edge]], src: str, named: dict[str, int]) -> str | None:
    """The first worker named by a finding that ``src`` waits on, at any distance (breadth first), or None."""
    seen, todo = {src}, [src]
    while todo:
        nxt = []
        for waiter in todo:
            for edge in graph.get(waiter, ()):
                if edge.target in seen:
                    continue
                if edge.target in named:
                    return edge.target
                seen.add(edge.target)
                nxt.append(edge.target)
        todo = nxt
    return None
