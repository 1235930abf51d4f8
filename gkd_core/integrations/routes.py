"""Where a watched job's process on any node sends its events, and keeps its stacks.

The supervisor's ipc socket is a file on its own node: a Ray worker on another node cannot reach it.
The job's driver (on the supervisor's node) writes the run's ``IngestRoute`` to Ray's key-value store:
the ipc socket for its own node and, once the cluster has another node, a CurveZMQ tcp ingest that
the supervisor opens on this node's Ray address (``open_ingest``), with the run's client keys. A worker
reads the route before it first reports. The keys travel through Ray's control store (token-
authenticated), as they do to our own trainer's workers as actor arguments; never on the event path.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ingest

KV_NAMESPACE = "gkd"


def _key(run: str) -> str:
    return f"{run}/ingest_route"


class RoutePublisher:
    """The driver's part: the route, written once Ray is up and again when the cluster grows."""

    def __init__(self, run: str, run_dir: str, local: str, control: str, emit: Callable[[ev.Event], None]):
        self.run, self.run_dir, self.control, self.emit = run, Path(run_dir), control, emit
        self.route = ingest.IngestRoute(local=local)
        self.refused = ""  # why the supervisor opened no ingest for other nodes (said once)

    def update(self, nodes: list[dict]) -> None:
        """Called with Ray's nodes at every poll of the cluster (cluster_watch)."""
        import ray

        here = ray.get_runtime_context().get_node_id()
        changed = here != self.route.head_node  # the first poll, or a new Ray cluster of the same process
        self.route.head_node = here
        alive = [n for n in nodes if n.get("Alive")]
        if len(alive) > 1 and not self.route.remote and not self.refused:
            node = next((n for n in alive if n.get("NodeID") == here), None)
            changed |= self._open(node.get("NodeManagerAddress", "") if node else "")
        if changed:
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(_key(self.run), msgspec.json.encode(self.route), overwrite=True, namespace=KV_NAMESPACE)

    def _open(self, host: str) -> bool:
        try:
            endpoint, curve = ingest.open_remote(self.control, host, self.run_dir / "keys")
        except Exception as e:
            self.refused = f"{type(e).__name__}: {e}"[:300]
            self.emit(ev.LogEvent(level="error", message=f"gkd: no ingest for the job's other nodes ({self.refused}); "
                                                         "their workers cannot report to this run"))
            return False
        self.route.remote, self.route.curve = endpoint, curve
        self.emit(ev.LogEvent(message=f"gkd: workers on other nodes push events to {endpoint} (CurveZMQ, this "
                                      "run's keys)"))
        return True


def lookup(run: str, node_id: str) -> tuple[str, ingest.Curve | None] | None:
    """(address, keys or None) for a worker on ``node_id``; None while the driver has not said yet."""
    from ray.experimental.internal_kv import _internal_kv_get

    raw = _internal_kv_get(_key(run), namespace=KV_NAMESPACE)
    if raw is None:
        return None
    route = msgspec.json.decode(raw, type=ingest.IngestRoute)
    if node_id != route.head_node and not route.remote:
        return None  # a node that joined a moment ago: the driver opens the tcp ingest at its next poll
    return route.direct(node_id)


def stacks_dir(run: str, run_dir: str) -> Path:
    """Where this process's faulthandler writes its stacks: the run's folder on the supervisor's node,
    a private folder of this node's temporary space elsewhere (read there by the stacks helper, remote_stacks)."""
    if run_dir and Path(run_dir).is_dir():
        return Path(run_dir) / "stacks"
    base = Path(tempfile.gettempdir()) / f"gkd-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    return base / run / "stacks"
