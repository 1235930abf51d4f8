"""Stacks of a watched job's workers on other nodes, taken there by a helper the job's driver starts.

The supervisor reads stacks on its own node (supervisor/local_stacks.py); a worker elsewhere is out of
its reach. It forwards those targets to the driver's command inbox, and the driver asks, on each of
their nodes, a helper actor of no CPU pinned to that node (``NodeAffinitySchedulingStrategy``, not
soft): py-spy there, else the faulthandler file the worker keeps on that node (routes.stacks_dir). The
stacks come back to the run as ``stack`` events, under the supervisor's dump id.

A node's helper is started with the job: at the driver's first look at the cluster that shows the node
(cluster_watch calls ``HELPERS.start_on``), before the job's own actors land there, and kept for the
job's life. Made at the first dump instead, the first dump on a loaded node waited for a Ray worker
process to start (over 15 s in CI), longer than the supervisor waits for the answer. A dump that still
finds its helper starting (a node that joined a moment ago) waits for it up to ``FIRST_WAIT_S``, and
the stack follows on the record when the helper answers later (within ``START_GIVE_UP_S`` of its start).
What making or killing a node's helper raised is said with that node's stacks that a dump could not take
(their events' ``error``), until a helper there answers.
The helper is not one of the job's workers: it is not named, and it does not report (its
``GKD_REPORT`` is "0").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gkd_core.integrations import job_env
from gkd_core.integrations.routes import KV_NAMESPACE, stacks_dir
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.ops import Where

# The supervisor waits 8 s from a dump's start for the stacks of other nodes (supervisor/local_stacks.py
# REMOTE_WAIT_S), then says they did not come: the driver's waits stay inside it.
CAPTURE_S = 4.0
WARM_WAIT_S = CAPTURE_S + 2.0  # a helper that is up: the capture alone
FIRST_WAIT_S = 7.0  # a helper still starting: its Ray worker process, then the capture
START_GIVE_UP_S = 60.0  # a helper not up by then is made again; a late stack is awaited as long


def node_key(run: str, actor_id: str) -> str:
    """Where a worker notes its Ray node id, for the driver to find it."""
    return f"{run}/node/{actor_id}"


def _capture_here(pids: dict[str, int], run: str, run_dir: str) -> dict[str, tuple[str, str, str]]:
    from gkd_core.node.stacks import capture_many

    caps = capture_many(pids, CAPTURE_S, faulthandler_dir=stacks_dir(run, run_dir))
    return {t: (c.method, c.text, c.error) for t, c in caps.items()}


class GkdStacksHelper:
    """One node's helper (made an actor by ``_Helpers``; Ray imports this module on that node)."""

    def ready(self) -> bool:
        """Answered once the helper's process is up: the driver's sign that a dump will not wait for it."""
        return True

    def capture(self, pids: dict[str, int], run: str, run_dir: str) -> dict[str, tuple[str, str, str]]:
        return _capture_here(pids, run, run_dir)


class _Helper:
    """A node's helper as the driver knows it: its handle, when it was made, and whether it is up."""

    def __init__(self, handle: Any, ready: Any):
        self.handle = handle
        self.made = time.monotonic()
        self.ready = ready  # the ref of its ``ready`` call: done once its process is up
        self.up = False

    def is_up(self) -> bool:
        if not self.up:
            import ray

            done, _ = ray.wait([self.ready], timeout=0, fetch_local=False)
            self.up = bool(done)
        return self.up


class _Helpers:
    """The driver's helpers, by Ray node id: one per node of the cluster but the driver's own (the
    supervisor's, whose stacks it takes itself), shared by dumps that come together."""

    def __init__(self):
        self._lock = threading.Lock()
        self._actor_class: Any = None
        self._here = ""  # the driver's node id: a new one is a new Ray cluster, whose helpers these are not
        self._by_node: dict[str, _Helper] = {}
        self._started: set[str] = set()  # nodes given a helper with the job: not again (a dump remakes one)
        # what making or killing a node's helper raised since one there last answered, by its type alone: not
        # logged or formatted (in a job's process, formatting an error of Ray's after ``ray.shutdown`` can touch
        # Ray and end the process), but said by a dump with the stacks it could not take there (``trouble``);
        # under "" a look at the cluster that failed before any node
        self._trouble: dict[str, str] = {}

    def start_on(self, nodes: list[dict]) -> None:
        """A helper on every live node of ``nodes`` (``ray.nodes()``) not seen before, but the driver's own;
        the helpers of nodes gone are forgotten (they went with their node). Never raises: it runs in the
        job's driver, whose job goes on whatever becomes of its helpers."""
        making = ""  # the node whose helper was being made, if it came to that
        try:
            import ray

            here = ray.get_runtime_context().get_node_id()
            alive = {n.get("NodeID", "") for n in nodes if n.get("Alive")}
            with self._lock:
                if here != self._here:
                    self._here, self._by_node, self._started, self._trouble = here, {}, set(), {}
                self._trouble.pop("", None)
                for node in [n for n in self._by_node if n not in alive]:
                    del self._by_node[node]
                # once per node: a helper that cannot start there (gkd-tui not installed on it) is not
                # made again every poll, only by the next dump that needs it
                for node in sorted(alive - {here, ""} - self._started):
                    making = node
                    if node not in self._by_node:
                        self._make(node)
                    self._started.add(node)
        except Exception as e:  # Ray refused to make it: tried again at the next look, and a dump there says why
            self._note(making, f"stacks helpers could not be started with the job ({type(e).__name__})")

    def _make(self, node: str) -> _Helper:
        """(under the lock) The node's helper, started now; its ``ready`` call says when it is up."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if self._actor_class is None:
            # (Ray's typed overloads of remote lack max_concurrency)
            as_actor = ray.remote(num_cpus=0, max_restarts=0, max_concurrency=4)  # type: ignore[call-overload]
            self._actor_class = as_actor(GkdStacksHelper)
        handle = self._actor_class.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            runtime_env={"env_vars": {job_env.REPORT: "0"}}).remote()
        helper = self._by_node[node] = _Helper(handle, handle.ready.remote())
        return helper

    def get(self, node: str) -> tuple[_Helper, float]:
        """(the node's helper, how long to wait for its answer)."""
        with self._lock:
            helper = self._by_node.get(node) or self._make(node)
        return helper, WARM_WAIT_S if helper.is_up() else FIRST_WAIT_S

    def late(self, node: str, helper: _Helper) -> bool:
        """A helper that did not answer in time: True when it is still starting (kept, a minute at most,
        and its answer still awaited); one that was up, or starts no more, is replaced."""
        starting = not helper.is_up() and time.monotonic() - helper.made < START_GIVE_UP_S
        if not starting:
            self.drop(node, helper)
        return starting

    def drop(self, node: str, helper: _Helper) -> None:
        """A helper that failed: the next dump on its node makes a new one."""
        import ray

        with self._lock:
            if self._by_node.get(node) is helper:
                del self._by_node[node]
        try:
            ray.kill(helper.handle, no_restart=True)
        except Exception as e:  # already gone with its node
            self._note(node, f"a failed stacks helper could not be killed ({type(e).__name__})")

    def _note(self, node: str, what: str) -> None:
        with self._lock:
            self._trouble[node] = what

    def trouble(self, node: str) -> str:
        """What went wrong with the helpers of ``node`` (or with a whole look at the cluster) since one there
        last answered, for a dump to say with the stacks it could not take there; "" when nothing did."""
        with self._lock:
            return "; ".join(t for t in (self._trouble.get(node, ""), self._trouble.get("", "")) if t)

    def answered(self, node: str, helper: _Helper) -> None:
        """``helper`` answered a dump: it is up, and what went wrong on its node before is over."""
        helper.up = True
        with self._lock:
            self._trouble.pop(node, None)


HELPERS = _Helpers()


def take(targets: dict[str, Where], dump_id: str, run: str, run_dir: str, emit: Callable[[ev.Event], None]) -> None:
    """``targets``: worker -> its pid and actor id. Every stack (or why there is none) is sent as an event."""
    import ray
    from ray.experimental.internal_kv import _internal_kv_get

    t0 = time.monotonic()
    by_node: dict[str, dict[str, int]] = {}
    for target, at in targets.items():
        where = _internal_kv_get(node_key(run, at.actor_id), namespace=KV_NAMESPACE) if at.actor_id else None
        if where is None:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=f"{target}'s node is not known to the driver"))
            continue
        by_node.setdefault(where.decode(), {})[target] = at.pid
    pending: dict[Any, tuple[str, _Helper, dict[str, int]]] = {}
    wait_s = 0.0
    for node, pids in by_node.items():
        try:
            helper, limit = HELPERS.get(node)
            pending[helper.handle.capture.remote(pids, run, run_dir)] = (node, helper, pids)
        except Exception as e:  # no helper there: its workers' stacks say why, the other nodes' still come
            for target in pids:
                emit(ev.StackEvent(dump_id=dump_id, target=target, error=_with_trouble(
                    node, f"no stacks helper could be made on its node: {type(e).__name__}: {e}"[:300])))
            continue
        wait_s = max(wait_s, limit)
    if not pending:
        return
    done, late = ray.wait(list(pending), num_returns=len(pending), timeout=max(0.0, t0 + wait_s - time.monotonic()))
    for ref in done:
        _answer(ref, pending[ref], dump_id, emit)
    still_starting = []
    for ref in late:
        node, helper, pids = pending[ref]
        starting = HELPERS.late(node, helper)
        if starting:
            still_starting.append(ref)
        why = (f"its node's stacks helper is still starting ({time.monotonic() - helper.made:.0f} s so far); the "
               "stack follows when it answers" if starting else f"the stacks helper on its node did not answer "
                                                                f"within {wait_s:g} s")
        for target in pids:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=_with_trouble(node, why)))
    if still_starting:
        # the same dump's stack, later: on the record (and the dashboard) once the helper is up
        give_up = max(pending[ref][1].made for ref in still_starting) + START_GIVE_UP_S
        done, _ = ray.wait(still_starting, num_returns=len(still_starting),
                           timeout=max(0.0, give_up - time.monotonic()))
        for ref in done:
            _answer(ref, pending[ref], dump_id, emit)


def _answer(ref: Any, asked: tuple[str, _Helper, dict[str, int]], dump_id: str,
            emit: Callable[[ev.Event], None]) -> None:
    """A helper's answer as stack events: its stacks, or why it failed."""
    import ray

    node, helper, pids = asked
    try:
        caps = ray.get(ref, timeout=1.0)
    except Exception as e:
        HELPERS.drop(node, helper)
        for target in pids:
            emit(ev.StackEvent(dump_id=dump_id, target=target, error=_with_trouble(
                node, f"the stacks helper on its node failed: {type(e).__name__}: {e}"[:300])))
        return
    HELPERS.answered(node, helper)
    for target, (method, text, error) in caps.items():
        emit(ev.StackEvent(dump_id=dump_id, target=target, method=method, text=text, error=error))


def _with_trouble(node: str, why: str) -> str:
    """Why a stack of ``node`` did not come, and what went wrong with that node's helpers before (or as this
    one was dropped): the one place the user hears of it."""
    trouble = HELPERS.trouble(node)
    return f"{why}; {trouble}" if trouble else why
