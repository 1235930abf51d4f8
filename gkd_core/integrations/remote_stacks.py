"""Stacks of a watched job's workers on other nodes, taken there by a helper the job's driver starts.

The supervisor reads stacks on its own node (supervisor/local_stacks.py); a worker elsewhere is out of
its reach. It forwards those targets to the driver's command inbox, and the driver asks, on each of
their nodes, a helper actor of no CPU pinned to that node (``NodeAffinitySchedulingStrategy``, not
soft): py-spy there, else the faulthandler file the worker keeps on that node (routes.stacks_dir). The
stacks come back to the run as ``stack`` events, under the supervisor's dump id.

A node's helper is made at the first dump that needs it and kept for the job's life: a task per dump
starts a worker process each time, seconds on a loaded node, and two dumps at once (an alert's own and
the user's) started two. The helper is not one of the job's workers: it is not named, and it does not
report (its ``GKD_REPORT`` is "0").
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from gkd_core.integrations import job_env
from gkd_core.integrations.routes import KV_NAMESPACE, stacks_dir
from gkd_core.telemetry import events as ev

FIRST_WAIT_S = 7.0  # a new helper: a worker process started on its node, then the capture
START_GIVE_UP_S = 60.0  # a helper not up by then is made again
CAPTURE_S = 4.0
WARM_WAIT_S = CAPTURE_S + 2.0  # a helper already there: the capture alone


def node_key(run: str, actor_id: str) -> str:
    """Where a worker notes its Ray node id, for the driver to find it."""
    return f"{run}/node/{actor_id}"


def _capture_here(pids: dict[str, int], run: str, run_dir: str) -> dict[str, tuple[str, str, str]]:
    from gkd_core.node.stacks import capture_many

    caps = capture_many(pids, CAPTURE_S, faulthandler_dir=stacks_dir(run, run_dir))
    return {t: (c.method, c.text, c.error) for t, c in caps.items()}


class GkdStacksHelper:
    """One node's helper (made an actor by ``_Helpers``; Ray imports this module on that node)."""

    def capture(self, pids: dict[str, int], run: str, run_dir: str) -> dict[str, tuple[str, str, str]]:
        return _capture_here(pids, run, run_dir)


class _Helpers:
    """The driver's helpers, by Ray node id; one made at a time, shared by dumps that come together."""

    def __init__(self):
        self._lock = threading.Lock()
        self._actor_class: Any = None
        self._by_node: dict[str, tuple[Any, float]] = {}  # node -> (handle, made at; 0 once it has answered)

    def get(self, node: str) -> tuple[Any, float]:
        """(the node's helper, how long to wait for its answer)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            if node not in self._by_node:
                if self._actor_class is None:
                    self._actor_class = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)(GkdStacksHelper)
                handle = self._actor_class.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                    runtime_env={"env_vars": {job_env.REPORT: "0"}}).remote()
                self._by_node[node] = (handle, time.monotonic())
            handle, made = self._by_node[node]
        return handle, FIRST_WAIT_S if made else WARM_WAIT_S

    def answered(self, node: str, handle: Any) -> None:
        with self._lock:
            if self._by_node.get(node, (None,))[0] is handle:
                self._by_node[node] = (handle, 0.0)

    def late(self, node: str, handle: Any) -> None:
        """A helper that did not answer in time: one still starting is kept for the next dump (a minute at
        most); one that had answered before, or starts no more, is replaced."""
        with self._lock:
            made = self._by_node.get(node, (None, 0.0))[1]
        if not made or time.monotonic() - made > START_GIVE_UP_S:
            self.drop(node, handle)

    def drop(self, node: str, handle: Any) -> None:
        """A helper that failed: the next dump on its node makes a new one."""
        import ray

        with self._lock:
            if self._by_node.get(node, (None,))[0] is handle:
                del self._by_node[node]
        try:
            ray.kill(handle, no_restart=True)
        except Exception:
            pass  # already gone with its node


HELPERS = _Helpers()


def take(targets: dict[str, list], dump_id: str, run: str, run_dir: str, emit: Callable[[ev.Event], None]) -> None:
    """``targets``: worker -> [pid, actor id]. Every stack (or why there is none) is sent as an event."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_get

    t0 = time.monotonic()
    by_node: dict[str, dict[str, int]] = {}
    for target, (pid, actor_id) in targets.items():
        node = _internal_kv_get(node_key(run, actor_id), namespace=KV_NAMESPACE) if actor_id else None
        if node is None:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"{target}'s node is not known to the driver"))
            continue
        by_node.setdefault(node.decode(), {})[target] = int(pid)
    pending: dict[Any, tuple[str, Any, dict[str, int]]] = {}
    wait_s = 0.0
    for node, pids in by_node.items():
        helper, limit = HELPERS.get(node)
        pending[helper.capture.remote(pids, run, run_dir)] = (node, helper, pids)
        wait_s = max(wait_s, limit)
    done, late = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, t0 + wait_s - time.monotonic()))
    for ref in done:
        node, helper, pids = pending[ref]
        try:
            caps = ray.get(ref, timeout=1.0)
        except Exception as e:
            HELPERS.drop(node, helper)
            for target in pids:
                emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"the stacks helper on its node failed: "
                                                                          f"{type(e).__name__}: {e}"[:300]))
            continue
        HELPERS.answered(node, helper)
        for target, (method, text, error) in caps.items():
            emit(ev.StackEvent(dump_id=dump_id, target=target, method=method, text=text, error=error))
    for ref in late:
        node, helper, pids = pending[ref]
        HELPERS.late(node, helper)
        for target in pids:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"the stacks helper on its node did not answer "
                                                                      f"within {wait_s:g} s"))
