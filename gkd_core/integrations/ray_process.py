"""A watched Ray job's process: its part of the watching (``WatchedProcess``: its Activity, the calls it made,
the actor it hosts) and who it is to the run, which it learns once its actor's name and its node's route are
written (an actor is named by its creator, a moment after it is made: actor_names; the route by the driver:
routes). ray_hook installs one in each process of the job.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from gkd_core.integrations import http_calls, job_env, remote_stacks, routes, torchrun
from gkd_core.integrations.activity import Activity
from gkd_core.integrations.actor_names import ActorNames
from gkd_core.integrations.job_queues import Queues
from gkd_core.integrations.routes import KV_NAMESPACE
from gkd_core.integrations.waits import RefBook, Sends, Wait
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter
from gkd_core.vocab import SERVED_ROUTE, WorkerId, src_of

NAME_WAIT_S = 10.0  # an actor whose creator wrote no name by then is named by its id
# a task that runs this long makes its worker one of the run's (a producer that is a Ray task: its requests, its
# waits and the calls it sends are the pipeline's); the thousands of short tasks of a job are not workers
TASK_SHOWN_S = 2.0
ROUTE_WAIT_S = 30.0  # a worker whose node the driver has not routed by then tries the supervisor's ipc
_said: set[str] = set()


def say_once(what: str, err: BaseException) -> None:
    """A failure of the watching's, on stderr once: the job runs on, unwatched."""
    if what not in _said:
        _said.add(what)
        print(f"gkd: {what} failed, this process is not watched by the run ({type(err).__name__}: {err})",
              file=sys.stderr, flush=True)


class WatchedProcess:
    """This process's part: its Activity, and (in a worker) the actor it hosts."""

    def __init__(self, kind: str):
        self.kind = kind
        self.run = os.environ.get(job_env.RUN_ID, "")
        self.actor_id = ""
        self.class_name = ""
        self.task: tuple[str, float] | None = None  # (function, since) of the task this worker runs now or last
        self.asked_since = 0.0
        self.activity = Activity(self._identify)
        self.actors = ActorNames(self.run)  # the names of the actors this process made or waits on
        self.book = RefBook(self.actors.name_of)  # the calls this process made, by ref
        self.sends = Sends(self.book)  # whom it sent calls to lately: said every few seconds, when they change
        self.queues = Queues()  # the job's queues, as data_waits sees them put into
        self._flow_said: ev.FlowEvent | None = None
        self.activity.periodic = self._say_lately
        self.step: int | None = None  # the job's training step, where a framework plugin reads it (verl)
        self.sync_timeout_s: float | None = None  # the job's own collective timeout, where a plugin read it
        self.sync_in_parts: int | None = None  # a sync said in parts (verl's checkpoint engine) now under way
        self.roles = ""  # a fused actor's roles (verl's WorkerDict: "actor_rollout+ref"), once its __init__ made them
        self._registered: tuple[Reporter, int | None] | None = None  # (its reporter, rank) once it said who it is
        self._roles_lock = threading.Lock()  # the watcher's registration and the actor's roles, in either order

    def _identify(self) -> Reporter | None:
        if self.kind == "driver":
            src, (role, rank) = torchrun.driver_src()  # each rank of a torchrun job is a driver: rank/<RANK>
            r = Reporter(src, heartbeat_s=job_env.heartbeat_s(), with_children=True)
            r.register(role, rank)
            return r
        if not self.actor_id:
            return self._identify_task()  # a task worker until an actor's __init__ runs here
        import ray
        from ray.experimental.internal_kv import _internal_kv_get, _internal_kv_put

        name = _internal_kv_get(f"{self.run}/actor/{self.actor_id}", namespace=KV_NAMESPACE)
        if name is None and time.monotonic() - self.asked_since < NAME_WAIT_S:
            return None  # its creator writes it a moment after creating it
        where = self._route()
        if where is None:
            return None
        # where the driver finds this worker to take its stacks, when its node is not the supervisor's
        _internal_kv_put(remote_stacks.node_key(self.run, self.actor_id), ray.get_runtime_context().get_node_id(),
                         namespace=KV_NAMESPACE)
        src = name.decode() if name else src_of(self.class_name, self.actor_id[:8])
        role, rank = WorkerId.parse(src)
        r = Reporter(src, heartbeat_s=job_env.heartbeat_s(), ingest=where[0], curve=where[1], with_children=True)
        with self._roles_lock:
            r.register(self.roles or role, rank, actor_id=self.actor_id)
            self._registered = (r, rank)
        return r

    def _identify_task(self) -> Reporter | None:
        """A task worker once its task has run TASK_SHOWN_S: a worker of the run named by the task's function and
        the first free slot of that name (``produce/0``, as an actor by its class), from then on."""
        task = self.task
        if task is None or time.monotonic() - task[1] < TASK_SHOWN_S:
            return None
        where = self._route()
        if where is None:
            return None
        from ray.experimental.internal_kv import _internal_kv_put

        n = 0
        while _internal_kv_put(f"{self.run}/slot/{task[0]}/{n}", f"task pid {os.getpid()}", overwrite=False,
                               namespace=KV_NAMESPACE):
            n += 1
        r = Reporter(src_of(task[0], n), heartbeat_s=job_env.heartbeat_s(), ingest=where[0], curve=where[1],
                     with_children=True)
        r.register(task[0], n)
        return r

    def task_begins(self, function: str) -> None:
        """A task of ``function`` (a remote function's name) begins in this worker."""
        if self.task is None:
            self.asked_since = time.monotonic()  # (its route, like an actor's, is looked for from now)
            self.activity.idle_unknown = not self.actor_id  # (between tasks, nothing to ask who it is for)
        self.task = (function, time.monotonic())

    def initialized(self, actor: Any) -> None:
        """After the actor's ``__init__``: a verl fused actor (``WorkerDict``, ``FusedWorker``) holds one worker
        per role, made there; its role is then theirs (``actor_rollout+ref``), so its peers are the actors
        fused alike, not every fused actor of the job."""
        fused = getattr(actor, "worker_dict", None) or getattr(actor, "fused_worker_dict", None)
        if not isinstance(fused, dict) or not fused or not all(isinstance(k, str) for k in fused):
            return
        with self._roles_lock:
            self.roles = "+".join(fused)
            if self._registered is not None:
                reporter, rank = self._registered
                reporter.register(self.roles, rank, actor_id=self.actor_id)

    def _route(self) -> tuple[str, Any] | None:
        """Where this worker's events go: the driver's route for its node (routes), once written."""
        import ray

        where = routes.lookup(self.run, ray.get_runtime_context().get_node_id())
        if where is None and time.monotonic() - self.asked_since > ROUTE_WAIT_S:
            say_once("finding the run's ingest for this node", TimeoutError(
                f"the job's driver wrote no route within {ROUTE_WAIT_S:.0f} s; trying {os.environ[job_env.INGEST]}"))
            where = (os.environ[job_env.INGEST], None)
        return where

    def entering_actor(self, actor: Any) -> None:
        """A call of ``actor``'s begins in this worker (a framework's, or an async actor's method)."""
        if not self.actor_id:
            self.entering_actor_class(type(actor).__name__)

    def entering_actor_class(self, class_name: str) -> None:
        """This worker hosts an actor of ``class_name``, being made now (or already running)."""
        if self.actor_id:
            return
        import ray

        self.class_name = class_name
        self.asked_since = time.monotonic()
        self.actor_id = ray.get_runtime_context().get_actor_id() or ""
        self.activity.idle_unknown = False  # an actor is named a moment after its __init__: asked until then

    def _say_lately(self, reporter: Reporter) -> None:
        """Every few seconds: whom it sent calls to, and what went through it (each when it changed)."""
        sent = self.sends.now()
        if sent is not None:
            reporter.emit(ev.SendsEvent(to=sent))
        counts = dict(self.activity.counts)  # (a copy made whole under the GIL: calls go on meanwhile)
        calls = dict(sorted(counts.items(), key=lambda kv: -kv[1])[:ev.FLOW_CALLS_MAX])
        flow = ev.FlowEvent(calls=calls, queues=self.queues.now(), serves=http_calls.served_at())
        said = self._flow_said
        # said by a pipeline's stages only (a queue, a server), so a job of a thousand actors is not a flow
        # event each every few seconds
        ours = flow.queues or any(SERVED_ROUTE.match(name) for name in calls)
        if ours and (said is None or (said.calls, said.queues, said.serves) != (flow.calls, flow.queues, flow.serves)):
            reporter.emit(flow)
            self._flow_said = flow

    def emit(self, event) -> None:
        if self.activity.reporter is not None:
            self.activity.reporter.emit(event)

    def make_wait(self, noted: tuple) -> Wait:
        """The Wait of a wait the main thread's wrapper noted: ``(name, start, refs, kwargs, step, sync in parts)``."""
        name, started, refs, kwargs, step, sync_in_parts = noted
        timeout = kwargs.get("timeout")
        refs = list(refs) if isinstance(refs, (list, tuple)) else [refs]
        return Wait(self.book, refs, self.emit, self.sync_timeout_s, step, whole=name == "ray.get",
                    num_returns=kwargs.get("num_returns", 1), in_sync=sync_in_parts is not None, started=started,
                    deadline=started + timeout if isinstance(timeout, (int, float)) else None)

    @property
    def current_wait(self) -> Wait | None:
        """What the main thread waits on now (a cancel reads it): the Wait the watcher made of it, or one made now."""
        noted = self.activity.main_wait
        if noted is None:
            return None
        made = self.activity.waits_made.get(id(noted))
        return made[2] if made is not None and made[0] is noted else self.make_wait(noted)
