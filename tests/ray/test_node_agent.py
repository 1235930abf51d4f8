"""Node agents on a two-node Ray cluster made on this machine: one per node, stacks from both."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import ray
import zmq
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from gkd_core.node.agent import gather_stacks, start_agents
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.ingest import IngestRoute


def rollout_class():
    """Stands in for a trainer worker: one method that never returns, one that holds the GIL.
    Made in a function so Ray ships it by value (the workers cannot import this test module)."""

    class Rollout:
        def where(self):
            return ray.get_runtime_context().get_node_id(), os.getpid()

        def sync_rollout_weights(self):
            time.sleep(600)

        def hold_the_gil(self):
            re.fullmatch(r"(a|aa)*c", "a" * 64)  # minutes in the regex engine's C loop

    return Rollout


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.add_node(num_cpus=1)
    ray.init(address=c.address, logging_level="ERROR")
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.timeout(240)
def test_one_agent_per_node_and_dump_stacks_gathers_both(cluster, tmp_path):
    pull = zmq.Context.instance().socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 2
    agents, labels = start_agents(IngestRoute(local=f"tcp://127.0.0.1:{port}"), "t", tmp_path,
                                  gpu_backend="fake:gpus=1", gpu_interval_s=0.5)
    try:
        assert sorted(agents) == sorted(nodes)
        ready = ray.get([a.ready.remote() for a in agents.values()], timeout=30)
        assert sorted(r["node_id"] for r in ready) == sorted(nodes)  # each agent answers from its own node
        assert sorted(labels) == sorted(nodes) and len(set(labels.values())) == 2
        Actor = ray.remote(num_cpus=0, max_concurrency=2)(rollout_class())
        # rollout/0 and rollout/2 on the first node, rollout/1 on the second
        placed = [nodes[0], nodes[1], nodes[0]]
        workers = {f"rollout/{i}": Actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False))
                   .remote() for i, n in enumerate(placed)}
        where = {name: tuple(ray.get(w.where.remote(), timeout=60)) for name, w in workers.items()}
        assert {node for node, _ in where.values()} == set(nodes)  # workers on both nodes
        workers["rollout/0"].sync_rollout_weights.remote()
        workers["rollout/1"].hold_the_gil.remote()
        os.kill(where["rollout/2"][1], signal.SIGSTOP)  # frozen, as by a debugger or Ctrl-Z
        time.sleep(1.0)
        t0 = time.monotonic()
        caps = gather_stacks(agents, labels, where, timeout_s=3.0)
        took = time.monotonic() - t0
        assert took < 5.0
        assert caps["rollout/0"].method == "py-spy" and "sync_rollout_weights" in caps["rollout/0"].text, caps
        assert "hold_the_gil" in caps["rollout/1"].text, caps["rollout/1"].error
        assert "is stopped" in caps["rollout/2"].error and "kill -CONT" in caps["rollout/2"].error

        # both agents report: registration and GPU readings, each under its own node, through its own relay (its
        # heartbeat in the relay's batch, not a message of its own)
        seen: dict[str, set] = {}
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not all(len(seen.get(k, ())) == 2 for k in ("gpu", "worker", "beat")):
            if pull.poll(200):
                e = wire.decode(pull.recv_multipart()[-1])
                if isinstance(e, ev.GpusEvent) and e.readings:  # (a sample's readings: one message a node)
                    seen.setdefault("gpu", set()).add(e.node)
                elif isinstance(e, ev.WorkerEvent):
                    seen.setdefault("worker", set()).add(e.src)
                elif isinstance(e, ev.HeartbeatsEvent):
                    seen.setdefault("beat", set()).update(b.src for b in e.beats if b.src == e.src)
                elif isinstance(e, ev.HeartbeatEvent):
                    seen.setdefault("alone", set()).add(e.src)
        assert seen.get("gpu") == set(labels.values())
        assert seen.get("worker") == seen.get("beat") == {f"agent/{label}" for label in labels.values()}
        assert not seen.get("alone"), seen
    finally:
        if "where" in locals():
            try:
                os.kill(where["rollout/2"][1], signal.SIGCONT)
            except (OSError, KeyError):
                pass
        for w in locals().get("workers", {}).values():
            ray.kill(w)
        for a in agents.values():
            ray.kill(a)
        pull.close(0)
