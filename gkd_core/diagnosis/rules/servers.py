"""Who serves an HTTP request a worker awaits: a worker of the run, wherever it runs, or a server outside the
job (a tool, a sandbox, an API), which the wait-for graph (waits.py) ends at and ``external_wait`` names.
"""

from __future__ import annotations

from gkd_core.state import RunState, WorkerState
from gkd_core.vocab import WORKER_ENDED, HttpWait, is_loopback

EXTERNAL_HINT = ("the server of this worker's request does not answer, and no worker of the run serves it (a tool, a "
                 "sandbox, an API, or a server on another node): look at that process (its log, its health "
                 "endpoint), or give the request a timeout; this worker only waits")


def live(state: RunState, src: str) -> bool:
    """Whether ``src`` is a worker of the run that has not ended."""
    w = state.workers.get(src)
    return w is not None and w.phase not in WORKER_ENDED and w.ray_state != "DEAD"


class Servers:
    """Who serves a request: the worker of the run whose process listens where it was sent, by that process's
    pid on the sender's node, else by the addresses its served requests came to (a server on another node: its
    flow events say them; a loopback address is this node's, found by its pid)."""

    def __init__(self, state: RunState):
        self.by_pid = {(s.node, s.pid): s.src for s in state.workers.values() if s.pid}
        self.by_address = {address: s.src for s in state.workers.values() if s.flows
                           for address in s.flows[-1].serves if not is_loopback(address)}

    def of(self, node: str, request: HttpWait) -> str:
        """The worker serving ``request`` sent from ``node`` ("" when none of the run's does)."""
        found = self.by_pid.get((node, request.pid), "") if request.pid else ""
        return found or self.by_address.get(request.address, "")


def external_request(state: RunState, w: WorkerState, servers: Servers | None = None) -> HttpWait | None:
    """The HTTP request ``w``'s phase awaits from a server that is no worker of the run (a tool, a sandbox,
    an API; on this node or another), or None."""
    requests = [r for r in map(HttpWait.parse, w.waits_on) if r is not None]
    if not requests:
        return None
    servers = Servers(state) if servers is None else servers
    return next((r for r in requests if not live(state, servers.of(w.node, r))), None)
