"""What holds a job that is not moving, in one line for the header: the kind of wait at the end of its driver's
chain of waits (DESIGN §11) — a cycle of waits, a collective or weight sync, an inference request inside a
server, an external call (a socket, HTTP or gRPC, a subprocess), or a Ray wait on a worker at work.

The chain is the wait-for graph's (rules/waits.py): from the driver along each first edge, through a
collective's node to a rank that has not joined it, to the worker that waits on nobody. Said only while an
alert says something is wrong and the driver has been where it is for the straggler threshold: a job at
work waits all the time.
"""

from __future__ import annotations

import re

from gkd_core import stack_text
from gkd_core.diagnosis.rules import servers, waits
from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.state import RunState, WorkerState
from gkd_core.units import spoken
from gkd_core.vocab import SYNC_OPEN, SYNC_PARTS, WORKER_ENDED

CHAIN_MAX = 64  # hops followed from the driver (a chain longer than this is said as far as it went)
# the files of the innermost frames of a stack that waits on something outside the job: a socket, an HTTP
# or gRPC client, a subprocess
EXTERNAL = re.compile(r"(?:^|/)(?:socket|ssl|subprocess)\.py|http/client|urllib|requests/|httpx|aiohttp|grpc")


def what_holds(state: RunState, now: float) -> str:
    """The header's "held by" line, or "" when nothing is wrong or the driver is not held."""
    active = state.active_alerts()
    if not any(a.severity in ("warn", "critical") for a in active):
        return ""
    drivers = sorted((w for w in state.workers.values() if w.role == "driver" and w.phase not in WORKER_ENDED),
                     key=lambda w: w.phase_since)
    if not drivers or now - drivers[0].phase_since < MIN_S:
        return ""
    driver = drivers[0]
    if any(a.code == "deadlock" for a in active):
        return "a cycle of waits: the deadlock above"
    parked = next((a for a in active if a.code == "producer_parked" and a.targets), None)
    if parked is not None:
        return (f"a queue starved by a parked producer: {parked.targets[0]} waits for {parked.evidence.get('gate')}"
                f" ({parked.evidence.get('queue')})")
    graph = waits.wait_graph(state)
    hops = _chain(graph, driver.src)
    if not hops:
        return _own_wait(state, driver, now)
    end = state.workers.get(hops[-1][1].target)
    collective = next((edge for _, edge in reversed(hops) if edge.collective), None)
    if collective is not None:  # its last edge is from the collective's node to a rank not in it
        return f"a collective: {collective.what}, which {collective.target} has not joined"
    if end is None:
        return ""
    return _at_the_end(state, end, hops, now)


def _chain(graph: dict[str, list[waits.Edge]], start: str) -> list[waits.Hop]:
    """From ``start`` along each node's oldest edge to a node that waits on nobody (or back to one seen)."""
    hops: list[waits.Hop] = []
    seen = {start}
    node = start
    while len(hops) < CHAIN_MAX and graph.get(node):
        edge = min(graph[node], key=lambda e: e.since)
        hops.append((node, edge))
        if edge.target in seen:
            break
        seen.add(edge.target)
        node = edge.target
    return hops


def _at_the_end(state: RunState, end: WorkerState, hops: list[waits.Hop], now: float) -> str:
    age = spoken(now - end.phase_since)
    sync = state.sync
    if sync is not None and sync.state in SYNC_OPEN and end.src in sync.parts_now:
        at = sync.parts_now[end.src]
        part = SYNC_PARTS.get(at.part, at.part)
        return f"a weight sync: sync {sync.sync_id}, {end.src} in {part} {spoken(now - at.since)}"
    last = hops[-1][1]
    if last.request and not end.phase.startswith(last.what.partition(" on ")[0]):
        # a server that shows no served call (one whose framework we do not watch yet): the request's own age
        return f"an HTTP request to a server: {end.src}, waiting {spoken(now - last.since)} ({_path(hops)})"
    if end.in_flight > 1 or last.request:
        return (f"an inference request in a server: {end.src}, {max(1, end.in_flight)} {end.phase} in flight, the "
                f"oldest {age}" + (f" ({_path(hops)})" if last.request else ""))
    if servers.external_request(state, end) is not None and "waiting for " in end.detail:
        return f"an external call: {end.src} waits for {end.detail.partition('waiting for ')[2]}"
    external = _external(state, end)
    if external:
        return f"an external call: {end.src} in {external}"
    return f"a Ray wait: {_path(hops)}, running {age}"


def _path(hops: list[waits.Hop]) -> str:
    """``driver → Trainer/0.train → MessageQueue/0.get_sample → Rollouter/0 (feeding put_sample) →
    InferenceServer/0: POST /generate on 127.0.0.1:8000``."""
    def hop(edge: waits.Edge) -> str:
        if edge.data:
            return f"{edge.target} (feeding {edge.what})"
        return f"{edge.target}: {edge.what}" if edge.request else f"{edge.target}.{edge.what}"

    return " → ".join([hops[0][0]] + [hop(edge) for _, edge in hops])


def _own_wait(state: RunState, driver: WorkerState, now: float) -> str:
    """A driver that waits on no worker of the run's graph: on our trainer's sync or teacher, or on what
    Ray cannot name to us (a task, an object)."""
    sync = state.sync
    if sync is not None and sync.state in SYNC_OPEN:
        return f"a weight sync: sync {sync.sync_id}, waiting for {', '.join(sync.pending[:4]) or 'nobody?'}"
    if driver.phase == "teacher_wait":
        return f"a teacher request: the driver waits for the teacher's logprobs, {spoken(now - driver.phase_since)}"
    if driver.phase in waits.WAIT_PHASES:
        return "a Ray wait on a task or an object (no actor call of the job's to follow)"
    external = _external(state, driver)
    return f"an external call: the driver in {external}" if external else ""


def _external(state: RunState, w: WorkerState) -> str:
    """Where ``w``'s newest stack waits, when that is outside the job (a socket, HTTP or gRPC, a subprocess)."""
    record = state.stacks.get(w.src)
    if record is None or not record.text or record.ts < w.phase_since:  # (one of an earlier phase says nothing)
        return ""
    frames = stack_text.user_thread(record.text)
    return stack_text.where(record.text) if any(EXTERNAL.search(file) for _, file, _ in frames[:3]) else ""
