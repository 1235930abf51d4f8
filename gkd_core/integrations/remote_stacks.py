"""Stacks of a watched job's workers on other nodes, taken there by a task the job's driver starts.

The supervisor reads stacks on its own node (supervisor/local_stacks.py); a worker elsewhere is out of
its reach. It forwards those targets to the driver's command inbox, and the driver runs, on each of
their nodes, one task of no CPU pinned to that node (``NodeAffinitySchedulingStrategy``, not soft):
py-spy there, else the faulthandler file the worker keeps on that node (routes.stacks_dir). The stacks
come back to the run as ``stack`` events, under the supervisor's dump id.
"""

from __future__ import annotations

from typing import Any, Callable

from gkd_core.integrations.routes import KV_NAMESPACE, stacks_dir
from gkd_core.telemetry import events as ev

TASK_TIMEOUT_S = 7.0  # the task's start on its node (a new worker process), then the capture
CAPTURE_S = 4.0


def node_key(run: str, actor_id: str) -> str:
    """Where a worker notes its Ray node id, for the driver to find it."""
    return f"{run}/node/{actor_id}"


def _capture_here(pids: dict[str, int], run: str, run_dir: str) -> dict[str, tuple[str, str, str]]:
    from gkd_core.node.stacks import capture_many

    caps = capture_many(pids, CAPTURE_S, faulthandler_dir=stacks_dir(run, run_dir))
    return {t: (c.method, c.text, c.error) for t, c in caps.items()}


def take(targets: dict[str, list], dump_id: str, run: str, run_dir: str, emit: Callable[[ev.Event], None]) -> None:
    """``targets``: worker -> [pid, actor id]. Every stack (or why there is none) is sent as an event."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_get
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, dict[str, int]] = {}
    for target, (pid, actor_id) in targets.items():
        node = _internal_kv_get(node_key(run, actor_id), namespace=KV_NAMESPACE) if actor_id else None
        if node is None:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"{target}'s node is not known to the driver"))
            continue
        by_node.setdefault(node.decode(), {})[target] = int(pid)
    capture = ray.remote(num_cpus=0, max_retries=0)(_capture_here)
    pending: dict[Any, dict[str, int]] = {}
    for node, pids in by_node.items():
        ref = capture.options(name=f"gkd: stacks of {', '.join(sorted(pids))}"[:200],
                              scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
                              ).remote(pids, run, run_dir)
        pending[ref] = pids
    done, late = ray.wait(list(pending), num_returns=len(pending), timeout=TASK_TIMEOUT_S)
    for ref in done:
        try:
            for target, (method, text, error) in ray.get(ref, timeout=1.0).items():
                emit(ev.StackEvent(dump_id=dump_id, target=target, method=method, text=text, error=error))
        except Exception as e:
            for target in pending[ref]:
                emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"the stacks task on its node failed: "
                                                                          f"{type(e).__name__}: {e}"[:300]))
    for ref in late:
        ray.cancel(ref, force=True)
        for target in pending[ref]:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"the stacks task on its node did not answer "
                                                                      f"within {TASK_TIMEOUT_S:g} s"))
