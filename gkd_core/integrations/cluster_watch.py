"""What the cluster can give a watched job: its nodes and placement groups, from the driver of the job.

A worker group that never starts (verl's ``RayResourcePool`` asking 10 CPUs a worker of a 4-CPU node,
seed 003) has no process to report anything: its driver sits in ``ray.get(pg.ready())``. The driver's
part polls Ray's control store (GCS: no dashboard needed) every ``POLL_S`` for the nodes' resources
and the placement groups, and sends each change, so the diagnosis can say "can never be placed"
with the numbers, or "waits for resources others hold". The nodes also go to each of ``on_nodes``
(routes: the ingest for workers on other nodes; remote_stacks: a stacks helper started on each). The
first poll is as soon as the job has called ``ray.init``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from gkd_core.node.ray_watch import placement_group_event
from gkd_core.telemetry import events as ev

POLL_S = 2.0


class ClusterWatch:
    def __init__(self, emit: Callable[[ev.Event], None], poll_s: float = POLL_S,
                 on_nodes: Sequence[Callable[[list[dict]], None]] = ()):
        self.emit, self.poll_s, self.on_nodes = emit, poll_s, on_nodes
        self._nodes: dict[str, tuple] = {}
        self._pgs: dict[str, tuple] = {}
        self.error = ""
        self._thread = threading.Thread(target=self._run, name="gkd-cluster-watch", daemon=True)

    def start(self) -> ClusterWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        import ray

        while True:
            if not ray.is_initialized():
                time.sleep(0.2)
                continue
            try:
                nodes = ray.nodes()
                for listener in self.on_nodes:
                    listener(nodes)
                self.poll_once(nodes, ray.util.placement_group_table())
                self.error = ""
            except Exception as e:  # the cluster going away with the job: said once, tried again
                error = f"{type(e).__name__}: {e}"[:200]
                if error != self.error:
                    self.error = error
                    self.emit(ev.LogEvent(level="warn", message=f"gkd: Ray's control store did not answer: {error}"))
            time.sleep(self.poll_s)

    def poll_once(self, nodes: list[dict], pgs: dict[str, dict]) -> None:
        now = time.time()
        for n in nodes:
            state = "ALIVE" if n.get("Alive") else "DEAD"
            resources = {k: float(v) for k, v in (n.get("Resources") or {}).items()}
            view = (state, tuple(sorted(resources.items())))
            node_id = n.get("NodeID", "")
            if self._nodes.get(node_id) != view:
                self._nodes[node_id] = view
                self.emit(ev.RayNodeEvent(node=n.get("NodeManagerAddress", ""), node_id=node_id, state=state,
                                          resources=resources, ts=now))
        for pg_id, pg in pgs.items():
            bundles = [dict(b) for _, b in sorted((pg.get("bundles") or {}).items())]
            e = placement_group_event(pg_id, pg.get("name", ""), pg.get("state", ""), pg.get("strategy", ""),
                                      bundles, pg.get("stats"), now)
            pg_view = (e.state, e.strategy, e.scheduling, repr(e.bundles))
            if self._pgs.get(pg_id) != pg_view:
                self._pgs[pg_id] = pg_view
                self.emit(e)
