"""A pipeline's view of a run (the dashboard's pipeline pane): its queues with what goes in and out of them,
the servers its rollouts call with their requests in flight, the addresses outside the job it waits on, and
how much of their time its workers spend idle or waiting.

Pure, from what the state already holds: the ``flow`` events (each worker's calls and queues, every few
seconds while they change), the phases (a server's route in flight, a wait's edges) and each worker's idle
seconds. A ``flow`` event comes only when something changed, so a count is taken to stand still between two
(and after the newest, once its period has passed): a queue whose worker went quiet is going nowhere, its
rates 0, not the last ones seen.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gkd_core.state.records import WorkerState
from gkd_core.state.run_record import RunRecord
from gkd_core.telemetry import events as ev
from gkd_core.vocab import SERVED_ROUTE as ROUTE
from gkd_core.vocab import HttpWait, is_loopback

RATE_WINDOW_S = 10.0  # rates are over this much of the newest flow
# a flow event is sent every PERIODIC_S (2 s) while anything changed: past this, nothing has since its newest
FLOW_STILL_S = 3.0
IDLE_WINDOW_S = 60.0  # a stage's idle share is over about this much of the newest time


@dataclass(frozen=True)
class QueueRow:
    worker: str
    name: str  # MessageQueue.samples
    depth: int
    puts_per_s: float | None  # None: not enough of its flow seen yet
    takes_per_s: float | None
    depths: list[int] = field(default_factory=list)  # its recent depths, oldest first (a sparkline)
    # the samples taken so far by how many versions they were behind the newest put (the last: that many or
    # more); empty where its samples say no version. Over time: the plots' pipeline tab
    behind: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ServerRow:
    worker: str
    route: str  # the route most served, or the one in flight
    in_flight: int
    oldest_s: float  # the oldest request in flight's age (0: none)
    per_s: float | None  # requests begun a second, on every route


@dataclass(frozen=True)
class PeerRow:
    """An address the job waits on over HTTP that no worker of its serves (a tool, another node's server)."""

    address: str
    pid: int  # the process listening on it on the waiter's node (0: none there)
    waiters: list[str]
    oldest_s: float  # since the longest wait on it began


@dataclass(frozen=True)
class PipelineView:
    queues: list[QueueRow]
    servers: list[ServerRow]
    peers: list[PeerRow]
    # the stages between them (a rollouter, a trainer): their share of the last minute or so spent idle or
    # waiting on others, the most idle first
    idle: list[tuple[str, float]]

    def __bool__(self) -> bool:
        return bool(self.queues or self.servers or self.peers)


def pipeline_view(st: RunRecord, now: float) -> PipelineView:
    queues: list[QueueRow] = []
    servers: list[ServerRow] = []
    peers: dict[str, tuple[int, list[str], float]] = {}
    seen = [st.workers[src] for src in sorted(st.in_pipeline | st.waiting) if src in st.workers]
    served = {(w.node, w.pid) for w in seen if _routes(w) or ROUTE.match(w.phase)}
    # the addresses the job's servers were reached at, from any node (a loopback one is each node's own)
    served_at = {a for w in seen if w.flows for a in w.flows[-1].serves if not is_loopback(a)}
    for w in seen:
        src = w.src
        if w.flows:
            queues += _queue_rows(st, w, now)
        if ROUTE.match(w.phase) or _routes(w):
            servers.append(_server_row(w, now))
        for said in w.waits_on:
            wait = HttpWait.parse(said)
            if wait is None or (w.node, wait.pid) in served or wait.address in served_at:
                continue
            pid, waiters, since = peers.get(wait.address, (wait.pid, [], now))
            peers[wait.address] = (pid, [*waiters, src], min(since, w.waits_since or now))
    # the stages between them: workers that send calls and are sent some (a rollouter, a trainer; not the
    # driver that starts them, nor the queues and servers, whose rows say theirs)
    holders = {q.worker for q in queues} | {s.worker for s in servers}
    called = {sent.rpartition(".")[0] for w in seen for sent in w.sends}
    stages = [w.src for w in seen if w.src in called and w.src not in holders and w.sends]
    idle = [(src, share) for src in stages if (share := idle_share(st.workers[src], now)) is not None]
    return PipelineView(queues, servers,
                        [PeerRow(a, pid, waiters, max(0.0, now - since)) for a, (pid, waiters, since) in
                         sorted(peers.items())], sorted(idle, key=lambda s: (-s[1], s[0])))


def idle_share(w: WorkerState, now: float) -> float | None:
    """The share of the last IDLE_WINDOW_S or so (from its newest mark at least that old, else its oldest)
    that ``w`` spent idle or waiting on others; None before a second of it is known."""
    marks = [m for m in w.idle_marks if m[0] <= now]
    if not marks:
        return None
    then, idle_then = next((m for m in reversed(marks) if m[0] <= now - IDLE_WINDOW_S), marks[0])
    if now - then < 1.0:
        return None
    idle_now = w.idle_s + (max(0.0, now - w.idle_from) if w.idle_from is not None else 0.0)
    return min(1.0, max(0.0, (idle_now - idle_then) / (now - then)))


def _queue_rows(st: RunRecord, w: WorkerState, now: float) -> list[QueueRow]:
    newest = w.flows[-1]
    rows = []
    for q in newest.queues:
        puts = _rate(w.flows, now, _queue_count(q.name, "puts"))
        grew = _rate(w.flows, now, _queue_count(q.name, "depth"))
        puts = None if puts is None else max(0.0, puts)  # (a count that went down: a process begun anew)
        takes = None if puts is None or grew is None else max(0.0, puts - grew)
        depths = [p.depth for p in st.series.queues.get(f"{w.src} {q.name}", [])[-24:]]
        rows.append(QueueRow(w.src, q.name, q.depth, puts, takes, depths, list(q.behind)))
    return rows


def _server_row(w: WorkerState, now: float) -> ServerRow:
    routes = _routes(w)
    serving = bool(ROUTE.match(w.phase))
    route = w.phase if serving else max(routes, key=lambda r: routes[r])
    per_s = _rate(w.flows, now, lambda f: sum(n for name, n in f.calls.items() if ROUTE.match(name))) \
        if w.flows else None
    return ServerRow(w.src, route, max(1, w.in_flight) if serving else 0,
                     max(0.0, now - w.phase_since) if serving else 0.0, per_s)


def _routes(w: WorkerState) -> dict[str, int]:
    return {name: n for name, n in w.flows[-1].calls.items() if ROUTE.match(name)} if w.flows else {}


def _queue_count(name: str, what: str) -> Callable[[ev.FlowEvent], int | None]:
    """The count ``what`` (its depth, its puts) of queue ``name`` in a flow (None: not in it)."""
    def count(f: ev.FlowEvent) -> int | None:
        for q in f.queues:
            if q.name == name:
                return q.depth if what == "depth" else q.puts
        return None

    return count


def _rate(flows: list[ev.FlowEvent], now: float, count: Callable[[ev.FlowEvent], int | None]) -> float | None:
    """The change a second of ``count(flow)`` over the newest RATE_WINDOW_S, a count standing still between
    two flows and after the newest once FLOW_STILL_S has passed; None with too little seen."""
    end = now if now - flows[-1].ts > FLOW_STILL_S else flows[-1].ts
    start = end - RATE_WINDOW_S
    then = next((f for f in reversed(flows) if f.ts <= start), None)
    if then is None:  # not seen that far back: from its first flow kept, if that is long enough ago
        then, start = flows[0], flows[0].ts
        if end - start < FLOW_STILL_S:
            return None
    before, after = count(then), count(flows[-1])
    if before is None or after is None or end <= start:
        return None
    return float(after - before) / (end - start)
