"""Any Ray job's processes reporting to a run, through Ray's own hooks, with no edit to the job.

- ``runtime_env_hook`` (Ray calls it in ``ray.init`` when ``RAY_RUNTIME_ENV_HOOK`` names it, which
  ``launch -- COMMAND`` does): adds the run's variables and ``setup_worker`` as the job's worker setup
  hook to the job's runtime_env, so every worker of the job reports, whether the command started Ray
  or joined a running cluster. The driver reports its waits, and the cluster's nodes and placement
  groups (cluster_watch). With ``GKD_WATCH=1`` and no run yet, it starts one first (opt_in).
- ``setup_worker`` (in every worker, before any task): each actor's method calls become its phases, with
  their call numbers (an async actor's in flight at once, activity), and its waits their detail (waits).

An actor is named by its class and the order its creator made it in (``Learner/3``, the fourth ``Learner``;
actor_names), which it reads from Ray's key-value store. A hook the user had set is
called first (the runtime-env hook) or kept (the setup hook). A failure of ours is said once on stderr, and
the job runs on unwatched; but the setup hook is a name Ray imports in each worker: where gkd-tui is not
installed (another node, a runtime_env's own environment), Ray ends the worker. README says to install it
wherever the job's workers run.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import threading
import time
from typing import Any

from gkd_core.integrations import job_env, opt_in, remote_stacks, routes, torchrun
from gkd_core.integrations.activity import Activity
from gkd_core.integrations.actor_names import ActorNames
from gkd_core.integrations.cancels import start_commands
from gkd_core.integrations.cluster_watch import ClusterWatch
from gkd_core.integrations.routes import KV_NAMESPACE
from gkd_core.integrations.waits import RefBook, Wait
from gkd_core.node.stacks import install_faulthandler
from gkd_core.telemetry.reporter import Reporter
from gkd_core.vocab import WorkerId, src_of

USER_SETUP_HOOK = "GKD_USER_WORKER_SETUP_HOOK"
NAME_WAIT_S = 10.0  # an actor whose creator wrote no name by then is named by its id
ROUTE_WAIT_S = 30.0  # a worker whose node the driver has not routed by then tries the supervisor's ipc
_said: set[str] = set()


def _say_once(what: str, err: BaseException) -> None:
    if what not in _said:
        _said.add(what)
        print(f"gkd: {what} failed, this process is not watched by the run ({type(err).__name__}: {err})",
              file=sys.stderr, flush=True)


def _load(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


# --- the driver -----------------------------------------------------------------------------

PRESTART = "RAY_prestart_worker_first_driver"


def runtime_env_hook(runtime_env: dict | None) -> dict | None:
    """Ray's ``RAY_RUNTIME_ENV_HOOK``: the job's runtime_env with the run's reporting added."""
    theirs = os.environ.get(job_env.USER_RAY_HOOK)
    if theirs:
        runtime_env = _load(theirs)(runtime_env)  # theirs first, and its errors are the job's, as without us
    if opt_in.wanted():
        try:
            opt_in.start_run()
        except Exception as e:
            _say_once("starting a run for this job (GKD_WATCH=1)", e)
            return runtime_env
    if not job_env.asked() or not _claim_driver():
        return runtime_env
    try:
        out = dict(runtime_env or {})
        env_vars = dict(out.get("env_vars") or {})
        for k, v in job_env.run_vars().items():
            env_vars.setdefault(k, v)
        setup = out.get("worker_process_setup_hook")
        if setup is None:
            out["worker_process_setup_hook"] = job_env.WORKER_SETUP_HOOK
        elif isinstance(setup, str):
            env_vars[USER_SETUP_HOOK] = setup
            out["worker_process_setup_hook"] = job_env.WORKER_SETUP_HOOK
        else:  # a function: Ray pickles it for the workers; ours runs after it
            out["worker_process_setup_hook"] = functools.partial(_after, setup)
        out["env_vars"] = env_vars
        # a local cluster that ray.init is about to start would prestart a worker a CPU for the default
        # runtime_env, which the job's actors, given this one, never use: idle processes that cost a start-up
        # each (bench/bench_ray_watch.py's "up"). The job's own setting wins.
        os.environ.setdefault(PRESTART, "0")
    except Exception as e:
        _say_once("adding the run's reporting to the Ray job", e)
        return runtime_env
    try:
        _install("driver")
    except Exception as e:
        _say_once("watching the driver", e)
    return out


def _after(their_setup) -> None:
    their_setup()
    setup_worker()


# --- every worker -----------------------------------------------------------------------------

def setup_worker() -> None:
    """Ray's ``worker_process_setup_hook``: this worker's actor reports its calls."""
    theirs = os.environ.get(USER_SETUP_HOOK)
    if theirs:
        _load(theirs)()  # their hook's failure is theirs to have, as it was without us
    if not job_env.asked():
        return
    try:
        _install("worker")
    except Exception as e:
        _say_once("watching this Ray worker", e)


class _Process:
    """This process's part: its Activity, and (in a worker) the actor it hosts."""

    def __init__(self, kind: str):
        self.kind = kind
        self.run = os.environ.get(job_env.RUN_ID, "")
        self.actor_id = ""
        self.class_name = ""
        self.asked_since = 0.0
        self.activity = Activity(self._identify)
        self.actors = ActorNames(self.run)  # the names of the actors this process made or waits on
        self.current_wait: Wait | None = None  # what the main thread waits on now (cancel reads it)
        self.book = RefBook()  # the calls this process made, by ref
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
            return None  # a task worker until an actor's __init__ runs here
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
            _say_once("finding the run's ingest for this node", TimeoutError(
                f"the job's driver wrote no route within {ROUTE_WAIT_S:.0f} s; trying {os.environ[job_env.INGEST]}"))
            where = (os.environ[job_env.INGEST], None)
        return where

    def entering_actor(self, actor: Any) -> None:
        if self.actor_id:
            return
        import ray

        self.class_name = type(actor).__name__
        self.asked_since = time.monotonic()
        self.actor_id = ray.get_runtime_context().get_actor_id() or ""

    def emit(self, event) -> None:
        if self.activity.reporter is not None:
            self.activity.reporter.emit(event)


_process: _Process | None = None
_install_lock = threading.Lock()


def installed() -> _Process | None:
    """This process's part, once a hook (or a framework plugin) installed it."""
    return _process


def in_ray_worker() -> bool:
    import ray

    return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE


def ensure_installed() -> _Process | None:
    """For a framework plugin, which may be imported before Ray's hooks ran (verl's driver imports verl
    before ``ray.init``): a Ray worker's part, or else the driver's (None in a child of either)."""
    if _process is None:
        _install("worker" if in_ray_worker() else "driver")
    return _process


def _claim_driver() -> bool:
    """Whether this process is the job's driver: the first to say so; its children inherit the mark."""
    theirs = os.environ.get(job_env.DRIVER_PID)
    if theirs and theirs != str(os.getpid()):
        return False
    os.environ[job_env.DRIVER_PID] = str(os.getpid())
    return True


def _install(kind: str) -> None:
    global _process
    with _install_lock:
        if _process is not None or (kind == "driver" and not _claim_driver()):
            return
        _process = _Process(kind)
        stacks = routes.stacks_dir(_process.run, os.environ.get(job_env.RUN_DIR, ""))  # the run's, or a private one
        install_faulthandler(stacks)  # stacks without py-spy, on SIGUSR1
        _process.activity.answer_task_stacks(stacks)  # an async actor's coroutines, which no thread shows
        _patch_actor_creation(_process)
        _patch_waits(_process)  # a driver's, and an actor's that drives others (verl's TaskRunner runs the loop)
        if kind == "worker":
            _patch_actor_methods(_process)
        else:
            _process.activity.start()
            route = routes.RoutePublisher(_process.run, os.environ.get(job_env.RUN_DIR, ""),
                                          os.environ.get(job_env.INGEST, ""), os.environ.get(job_env.CONTROL, ""),
                                          _process.emit)
            # a worker group that never starts has nobody else to say so; the route to other nodes; and, for a
            # driver with a command inbox, a stacks helper on each, started with the job (cancels, remote_stacks)
            on_nodes = start_commands(_process, _process.emit, os.environ.get(job_env.COMMANDS, ""))
            ClusterWatch(_process.emit, on_nodes=[route.update, *on_nodes]).start()


def _patch_actor_creation(p: _Process) -> None:
    from ray.actor import ActorClass, ActorMethod

    make = ActorClass._remote

    @functools.wraps(make)
    def _remote(self, *args, **kwargs):
        handle = make(self, *args, **kwargs)
        try:
            if self.__ray_metadata__.class_name != remote_stacks.GkdStacksHelper.__name__:  # ours, not the job's
                p.actors.name_created(self.__ray_metadata__.class_name, handle, kwargs)
        except Exception as e:
            _say_once("naming a new actor", e)
        return handle

    ActorClass._remote = _remote  # type: ignore[method-assign]  # (Ray's own, wrapped)

    call = ActorMethod._remote

    @functools.wraps(call)
    def _call(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        try:
            p.book.sent(p.actors.name_of(self._actor), self._method_name, out)
        except Exception as e:
            _say_once("noting an actor call", e)
        return out

    ActorMethod._remote = _call  # type: ignore[method-assign]  # (Ray's own, wrapped)


def begin(name: str, actor: Any = None, step: int | None = None, lane: Any = None) -> int | None:
    """A call of the job's begins (an actor's method, a framework's phase): noted, never raising into it."""
    try:
        assert _process is not None, "no hook installed"  # (a plugin's call before the hooks: said once below)
        if actor is not None:
            _process.entering_actor(actor)
        return _process.activity.enter(name, step=step, lane=lane)
    except Exception as e:
        _say_once("noting a call", e)
        return None


def end(token: int | None) -> None:
    if token is not None:
        try:
            assert _process is not None, "no hook installed"
            _process.activity.leave(token)
        except Exception as e:
            _say_once("noting the end of a call", e)


def _patch_actor_methods(p: _Process) -> None:
    from ray._private.function_manager import FunctionActorManager

    make = FunctionActorManager._make_actor_method_executor

    @functools.wraps(make)
    def make_executor(self, method_name: str, method):
        executor = make(self, method_name, method)
        if method_name.startswith("__ray"):
            return executor  # Ray's own (ready checks, terminate)
        run: Any  # either kind of function, with the attributes Ray's task executor reads
        if inspect.iscoroutinefunction(method):
            async def run(__ray_actor, *args, **kwargs):
                coro = executor(__ray_actor, *args, **kwargs)
                token = begin(method_name, __ray_actor, lane=coro)  # its lane, and the stack shown of it
                try:
                    return await coro
                finally:
                    end(token)
        else:
            def run(__ray_actor, *args, **kwargs):
                token = begin(method_name, __ray_actor)
                try:
                    out = executor(__ray_actor, *args, **kwargs)
                finally:
                    end(token)
                if method_name == "__init__":
                    try:
                        p.initialized(__ray_actor)
                    except Exception as e:
                        _say_once("reading the roles of a fused actor", e)
                return out
        run.name, run.method = executor.name, executor.method  # what Ray's task executor reads
        return run

    FunctionActorManager._make_actor_method_executor = make_executor  # type: ignore[method-assign]  # (Ray's)


def _patch_waits(p: _Process) -> None:
    """``ray.get`` and ``ray.wait`` on the main thread: what they wait for, as a phase or as the detail of
    the phase they are in; a wait on a weight sync, a ``sync``."""
    import ray

    for name in ("get", "wait"):
        original = getattr(ray, name)

        def waiting(refs, *args, _original=original, _name=f"ray.{name}", **kwargs):
            if threading.current_thread() is not threading.main_thread() or (p.kind == "worker" and not p.actor_id):
                return _original(refs, *args, **kwargs)  # (a task's worker is no worker of the run's)
            timeout = kwargs.get("timeout")
            deadline = time.time() + timeout if isinstance(timeout, (int, float)) else None
            try:
                wait = Wait(p.book, list(refs) if isinstance(refs, (list, tuple)) else [refs], p.emit, p.sync_timeout_s,
                            p.step, whole=_name == "ray.get", num_returns=kwargs.get("num_returns", 1),
                            in_sync=p.sync_in_parts is not None)
                token = p.activity.enter(_name, progress=wait.progress, wait=True, waits_on=wait.waits_on,
                                         deadline=deadline)  # whom it waits for: asked once it is shown
            except Exception as e:  # the job's wait goes on, unseen
                _say_once("noting a wait", e)
                return _original(refs, *args, **kwargs)
            error = None
            outer, p.current_wait = p.current_wait, wait
            try:
                return _original(refs, *args, **kwargs)
            except BaseException as e:
                error = e
                raise
            finally:
                p.current_wait = outer
                try:  # never in place of the job's own result or error
                    p.activity.leave(token)
                    wait.ended(error)
                except Exception as e:
                    _say_once("noting the end of a wait", e)

        functools.update_wrapper(waiting, original)
        setattr(ray, name, waiting)
