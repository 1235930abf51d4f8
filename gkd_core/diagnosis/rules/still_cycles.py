"""A cycle of waits that has stopped, said as what it is: a deadlock, every member and edge named; or a
pipeline's queue starved by its parked producer, the producer named and the rest blocked by it.

A deadlock is a cycle none of whose members has moved for ``STILL_S``: each waits on the next. A pipeline
makes one of another kind: the trainer waits on the queue, the queue waits on its producer's calls, and the
producer, parked at a staleness gate, waits on the trainer's call of its ``update_param_version``, which the
trainer sends only after it gets the data it waits for. Every member waits; the one to look at is the
producer at the gate (what it waits for, and the numbers it holds: the version it wants), so it alone is
named (``producer_parked``), the queue and the consumers blocked by it.
"""

from __future__ import annotations

from gkd_core.diagnosis.cascade import BLOCKED_MAX
from gkd_core.diagnosis.rules.waits import STILL_S, WAIT_PHASES, Edge, Hop, Knots, waiting_on
from gkd_core.state import RunState, WorkerState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken
from gkd_core.vocab import DataWait


def _call(w: WorkerState, method: str | None = None) -> str:
    """``Inference/0.generate #3``: a worker's running call (``method`` when it is that one), with its
    number; a driver's own wait is its name alone."""
    if w.phase in WAIT_PHASES and method is None:
        return w.src
    name = f"{w.src}.{method or w.phase}"
    return f"{name} #{w.phase_call}" if w.phase_call is not None and (method is None or method == w.phase) else name


def _edge_name(edge: Edge) -> str:
    if edge.data:
        return f"{edge.target} sending {edge.what}"
    return f"{edge.target}: {edge.what}" if edge.collective else f"{edge.target}.{edge.what}"


def _hop(state: RunState, edge: Edge) -> str:
    target = state.workers[edge.target]
    if edge.collective:
        return f"{target.src} to join {edge.what} (it is in {_call(target).removeprefix(target.src + '.')})"
    if edge.data:
        return f"{target.src} to send {edge.what} (it is in {_call(target).removeprefix(target.src + '.')})"
    if edge.what == target.phase:
        return _call(target)
    return f"{_call(target, edge.what)}, queued behind {_call(target)}"


def deadlocks(state: RunState, now: float, found: Knots) -> list[AlertEvent]:
    """Each cycle none of whose members has moved for ``STILL_S``: critical, every member named; or, through a
    producer parked on data, that producer named (``producer_parked``) and the rest blocked by it."""
    out = []
    for hops in found.cycles:
        members = [state.workers[src] for src, _ in hops]
        moved = max(max(w.phase_since, edge.since) for w, (_, edge) in zip(members, hops, strict=True))
        if now - moved < STILL_S:
            continue
        parked = _parked_producer(state, hops)
        if parked is not None:
            out.append(_starved(state, hops, parked, now - moved, found))
            continue
        # said from its longest-waiting member: the one whose call began the cycle
        first = min(range(len(hops)), key=lambda i: (members[i].phase_since, members[i].src))
        hops, members = hops[first:] + hops[:first], members[first:] + members[:first]
        chain = ", which waits for ".join(_hop(state, edge) for _, edge in hops)
        still = now - moved
        blocked = sorted(waiting_on(found.graph, {w.src for w in members}))
        out.append(AlertEvent(
            severity="critical", code="deadlock", targets=[w.src for w in members],
            message=f"deadlock: {_call(members[0])} waits for {chain}; none of the {len(members)} has moved for "
                    f"{spoken(still)}" + (f"; {len(blocked)} more wait on it ({', '.join(blocked[:4])})"
                                          if blocked else ""),
            hint="each waits on the next, so none can return: their stacks (d) show the waits. Break the cycle "
                 "in the job: a method must not wait on a call that needs its own actor free (run that call "
                 "before, or make the actor threaded or async), nor wait in ray.get on a peer that waits on it",
            evidence={"cycle": [[src, _edge_name(edge)] for src, edge in hops], "elapsed_s": round(still, 1),
                      "blocked": blocked[:BLOCKED_MAX]}))
    return out


def _parked_producer(state: RunState, hops: list[Hop]) -> int | None:
    """In a cycle, the hop of a producer parked on data: a member that others wait on for data (it feeds their
    queue) and that itself waits on data (a gate) — the pipeline's shape, where the trainer waits on the queue,
    the queue on its producer, and the producer's gate on the trainer's new version; or a member that is its
    own queue's producer (slime's: a thread of its own fills the queue its call waits on, and that thread waits
    on the gate; or a task fills it by a call of it, and waits at the gate by another, its consumer waiting on a
    third call of it). None: no such member."""
    for i, (src, edge) in enumerate(hops):
        w, before = state.workers[src], hops[i - 1][1]
        if edge.data and (before.data or _own_thread_feeds(w) or _another_call(w, before)):
            return i
    return None


def _another_call(w: WorkerState, waited: Edge) -> bool:
    """Whether ``waited`` is a wait on a call of ``w``'s other than the one it shows (a threaded actor's: the
    consumer's ``get_sample`` beside the producer's parked ``pass_gate``)."""
    return not waited.data and not waited.collective and waited.what != w.phase


def _own_thread_feeds(w: WorkerState) -> str:
    """The thread of ``w``'s own that feeds what its call waits on, alive ("" when none does)."""
    for said in w.waits_on:
        data = DataWait.parse(said)
        for m in data.methods if data is not None else ():
            if DataWait.thread(m) and not DataWait.ended(m):
                return DataWait.thread(m)
    return ""


def _starved(state: RunState, hops: list[Hop], parked: int, still: float, found: Knots) -> AlertEvent:
    """The cycle through a parked producer, said as what it is: the producer at its gate, named; the queue it
    feeds and the consumers at the queue's end blocked by it."""
    producer, gate = hops[parked]
    fed, feeding = hops[parked - 1]  # the queue that waits on the producer's calls, for ``feeding.what``
    p = state.workers[producer]
    where = p.detail.partition("waiting on ")[2] or p.detail
    others = [src for src, _ in hops if src != producer]
    blocked = sorted((set(others) | waiting_on(found.graph, {src for src, _ in hops})) - {producer})
    # the queue: another worker's, waiting on the producer's calls; or the producer's own, that a thread of its
    # own fills (slime's), which the consumer waits on by a call of it
    thread = _own_thread_feeds(p) if not feeding.data else ""
    queue = (f"{producer}.{feeding.what}, whose queue only {producer}'s thread {thread} fills" if thread
             else f"{fed}, which waits for {producer} to send {feeding.what}" if feeding.data
             else f"{producer}.{feeding.what}, another call of {producer}'s, beside the parked one")
    return AlertEvent(
        severity="critical", code="producer_parked", targets=[producer],
        message=f"a queue starved by a parked producer: {_call(p)} waits on {where or 'data'}; only {gate.target}'s "
                f"calls of {gate.what} open it, and {gate.target} waits on {queue}; none has moved for "
                f"{spoken(still)}",
        hint=f"the gate waits for a call that cannot come: {gate.target} sends {gate.what} only after it gets data "
             f"that {producer} will not produce while parked (verl's fully async run at 'Parameter version updated "
             f"from 0 to 0'). Send the new version before waiting for more data, or let the gate's bound admit "
             f"what the consumer needs; {producer}'s stack (d) shows the gate",
        evidence={"cycle": [[src, _edge_name(edge)] for src, edge in hops], "elapsed_s": round(still, 1),
                  "parked": p.detail[:300], "gate": f"{gate.target} sending {gate.what}",
                  "queue": queue, "blocked": blocked[:BLOCKED_MAX]})
