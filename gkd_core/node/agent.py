"""One agent per Ray node: the GPU sampler for that node, stacks of that node's workers, and the word
that the node's CPU is held by processes outside the run (``cpu_load``).

The agent is a Ray actor pinned to its node (node affinity, no CPU reserved), threaded so a dump
is answered while the sampler runs. It reports through its own Reporter as ``agent/<node>``. The
driver fans a ``dump_stacks`` out to every agent at once and gathers within one deadline
(:func:`gather_stacks`); what an agent does not answer in time comes back as a note naming it.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import msgspec

from gkd_core.node.cpu_load import NODE_WATCHING, CpuLoad, NodeLoadWatch
from gkd_core.node.gpu_sampler import GpuSampler
from gkd_core.node.stacks import Capture, capture_many
from gkd_core.telemetry.ingest import IngestRoute
from gkd_core.telemetry.relay import Relay, relay_path
from gkd_core.telemetry.reporter import Reporter
from gkd_core.vocab import src_of

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level

READY_TIMEOUT_S = 60.0


class NodeAgent:
    def __init__(self, label: str, route: IngestRoute, run_id: str, run_dir: str, gpu_backend: str = "nvml",
                 gpu_interval_s: float = 2.0, nvml_deadline_s: float = 3.0, heartbeat_s: float = 1.0):
        import ray

        self.label = label
        self.run_dir = Path(run_dir)
        address, curve = route.direct(ray.get_runtime_context().get_node_id())
        # the node's workers push to the relay; it pushes to the supervisor, their heartbeats batched. The agent's
        # own events go through it too: its heartbeat rides in the batch (16,384 messages a second fewer at 16,384
        # nodes), and a relay that stops takes the agent's word with its workers', so that the silence is named
        # once, as the agent's
        self.relay: Relay | None = Relay(src_of("agent", label), label, address, path=relay_path(run_id, label),
                                         run=run_id, curve=curve, interval_s=heartbeat_s)
        no_relay = ""
        try:
            self.relay.start()
        except Exception as e:  # the workers of this node then push straight to the supervisor
            no_relay = f"{type(e).__name__}: {e}"
            self.relay = None
        ingest, rep_curve = (self.relay.address, None) if self.relay is not None else (address, curve)  # (ipc: 0600)
        self.rep = Reporter(src_of("agent", label), ingest=ingest, run=run_id, heartbeat_s=heartbeat_s, curve=rep_curve)
        self.rep.register("agent", node=label)
        self.rep.set_phase(NODE_WATCHING)
        if no_relay:
            self.rep.log(f"agent/{label}: no relay ({no_relay}); this node's workers push their events straight to "
                         "the supervisor", level="warn")
        self.sampler = GpuSampler(label, self.rep.emit, backend=gpu_backend, interval_s=gpu_interval_s,
                                  deadline_s=nvml_deadline_s).start()
        # the agent is a Ray worker: its parent is the node's raylet, under which the run's workers are
        self.load = NodeLoadWatch(label, self.rep, CpuLoad(run_id, ray_root=os.getppid()),
                                  interval_s=gpu_interval_s).start()

    def ready(self) -> dict:
        import ray

        return {"label": self.label, "pid": os.getpid(), "host": socket.gethostname(),
                "node_id": ray.get_runtime_context().get_node_id(),
                "relay": self.relay.address if self.relay is not None else ""}

    def dump(self, pids: dict[str, int], timeout_s: float) -> dict[str, dict]:
        """Stacks of these local processes ({name: pid}), all at once, within ``timeout_s``."""
        caps = capture_many(pids, timeout_s, faulthandler_dir=self.run_dir / "stacks")
        return {name: msgspec.to_builtins(c) for name, c in caps.items()}

    def stop(self) -> None:
        self.sampler.stop()
        self.load.stop()
        self.rep.close()  # (before its relay: its last events go through it)
        if self.relay is not None:
            self.relay.stop()


def node_labels(nodes: list[dict]) -> dict[str, str]:
    """node id -> a short readable name: the host name, with the id's head where hosts repeat
    (several Ray nodes on one machine, as in tests)."""
    hosts = [n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node" for n in nodes]
    return {n["NodeID"]: (h if hosts.count(h) == 1 else f"{h}-{n['NodeID'][:6]}")
            for n, h in zip(nodes, hosts, strict=True)}


def start_agents(route: IngestRoute, run_id: str, run_dir: Path, gpu_backend: str = "nvml", gpu_interval_s: float = 2.0,
                 nvml_deadline_s: float = 3.0, heartbeat_s: float = 1.0,
                 only: set[str] | None = None, ready: dict[str, dict] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, str]]:
    """One agent on every live node (or on the nodes ``only`` names). Returns ({node id: handle},
    {node id: label}); nodes whose agent did not come up within the deadline are left out (and said
    so in the log by the caller). ``ready`` is filled with each agent's answer (its relay's address)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    labels = node_labels(nodes)
    # (Ray's typed overloads of remote lack max_concurrency)
    Agent = ray.remote(num_cpus=0, max_concurrency=4)(NodeAgent)  # type: ignore[call-overload]
    handles = {}
    for n in nodes:
        node_id = n["NodeID"]
        if only is not None and node_id not in only:
            continue
        handles[node_id] = Agent.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(labels[node_id], route, run_id, str(run_dir), gpu_backend, gpu_interval_s, nvml_deadline_s,
                 heartbeat_s)
    refs = {node_id: h.ready.remote() for node_id, h in handles.items()}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=READY_TIMEOUT_S)
    up = {node_id: handles[node_id] for node_id, ref in refs.items() if ref in done}
    if ready is not None:
        for node_id in up:
            try:
                ready[node_id] = ray.get(refs[node_id], timeout=5.0)
            except Exception as e:  # an agent that failed its own start: no relay on that node
                log.debug("the agent of node %s failed its start: %s", node_id, e)
                ready[node_id] = {}
    return up, labels


def gather_stacks(agents: dict[str, Any], labels: dict[str, str], where: dict[str, tuple[str, int]],
                  timeout_s: float = 3.0) -> dict[str, Capture]:
    """Stacks of every target ({name: (node id, pid)}), through each node's agent, in parallel;
    within ``timeout_s`` plus a margin for the round trip, whatever the agents do."""
    import ray

    by_node: dict[str, dict[str, int]] = {}
    out: dict[str, Capture] = {}
    for name, (node_id, pid) in where.items():
        if node_id in agents:
            by_node.setdefault(node_id, {})[name] = pid
        else:
            out[name] = Capture(pid=pid, error=f"no agent on node {labels.get(node_id, node_id[:8])} "
                                               "(it did not start, or the node joined later)")
    refs = {agents[node_id].dump.remote(pids, timeout_s): node_id for node_id, pids in by_node.items()}
    t0 = time.monotonic()
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s + 1.0) if refs else ([], [])
    for ref, node_id in refs.items():
        pids = by_node[node_id]
        try:
            got = ray.get(ref, timeout=0.5) if ref in ready else None
        except Exception as e:
            got, why = None, f"the agent on {labels.get(node_id)} failed: {type(e).__name__}: {e}"[:300]
        else:
            why = (f"the agent on {labels.get(node_id)} did not answer within "
                   f"{time.monotonic() - t0:.1f} s (its node may be overloaded or gone)")
        for name, pid in pids.items():
            out[name] = msgspec.convert(got[name], Capture) if got and name in got else Capture(pid=pid, error=why)
    return out
