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
installed (another node, a runtime_env's own environment), Ray ends the worker. docs/your-jobs.md says to install it
wherever the job's workers run.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import threading
import time
from typing import Any

from gkd_core.integrations import data_waits, http_calls, job_env, opt_in, remote_stacks, routes
from gkd_core.integrations.calls import entered_async
from gkd_core.integrations.cancels import start_commands
from gkd_core.integrations.cluster_watch import ClusterWatch
from gkd_core.integrations.ray_process import WatchedProcess, say_once
from gkd_core.integrations.waits import BOOK_MAX
from gkd_core.node.stacks import install_faulthandler

USER_SETUP_HOOK = "GKD_USER_WORKER_SETUP_HOOK"


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
            say_once("starting a run for this job (GKD_WATCH=1)", e)
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
        say_once("adding the run's reporting to the Ray job", e)
        return runtime_env
    try:
        _install("driver")
    except Exception as e:
        say_once("watching the driver", e)
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
        say_once("watching this Ray worker", e)


_process: WatchedProcess | None = None
_install_lock = threading.Lock()


def installed() -> WatchedProcess | None:
    """This process's part, once a hook (or a framework plugin) installed it."""
    return _process


def in_ray_worker() -> bool:
    import ray

    return ray.is_initialized() and ray._private.worker.global_worker.mode == ray.WORKER_MODE


def ensure_installed() -> WatchedProcess | None:
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
        _process = WatchedProcess(kind)
        stacks = routes.stacks_dir(_process.run, os.environ.get(job_env.RUN_DIR, ""))  # the run's, or a private one
        install_faulthandler(stacks)  # stacks without py-spy, on SIGUSR1
        _process.activity.answer_task_stacks(stacks)  # an async actor's coroutines, which no thread shows
        _patch_actor_creation(_process)
        _patch_waits(_process)  # a driver's, and an actor's that drives others (verl's TaskRunner runs the loop)
        http_calls.install(_process.activity, say_once)  # requests sent (waits) and served (calls), as imported
        # a call's wait on a queue or a gate: on whoever feeds it; and the job's queues, as they are put into
        data_waits.install(_process.activity, _process.queues, say_once)
        if kind == "worker":
            _patch_actor_methods(_process)
            _patch_tasks(_process)
        else:
            _process.activity.start()
            route = routes.RoutePublisher(_process.run, os.environ.get(job_env.RUN_DIR, ""),
                                          os.environ.get(job_env.INGEST, ""), os.environ.get(job_env.CONTROL, ""),
                                          _process.emit)
            # a worker group that never starts has nobody else to say so; the route to other nodes; and, for a
            # driver with a command inbox, a stacks helper on each, started with the job (cancels, remote_stacks)
            on_nodes = start_commands(_process, _process.emit, os.environ.get(job_env.COMMANDS, ""))
            ClusterWatch(_process.emit, on_nodes=[route.update, *on_nodes]).start()


def _patch_actor_creation(p: WatchedProcess) -> None:
    from ray.actor import ActorClass, ActorMethod

    make = ActorClass._remote

    @functools.wraps(make)
    def _remote(self, *args, **kwargs):
        handle = make(self, *args, **kwargs)
        try:
            if self.__ray_metadata__.class_name != remote_stacks.GkdStacksHelper.__name__:  # ours, not the job's
                p.actors.name_created(self.__ray_metadata__.class_name, handle, kwargs)
        except Exception as e:
            say_once("naming a new actor", e)
        return handle

    ActorClass._remote = _remote  # type: ignore[method-assign]  # (Ray's own, wrapped)

    call = ActorMethod._remote
    book = p.book
    from ray import ObjectRef

    @functools.wraps(call)
    def _call(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        try:  # at every call of the job: the method's name stored in the book by the ref, nothing looked up
            if type(out) is ObjectRef:
                newer = book.newer
                newer[out.binary()] = self._method_name
                if len(newer) >= BOOK_MAX:
                    book.turn(newer)
            else:
                book.note(self._method_name, out)
        except Exception as e:
            say_once("noting an actor call", e)
        return out

    ActorMethod._remote = _call  # type: ignore[method-assign]  # (Ray's own, wrapped)


def begin(name: str, actor: Any = None, step: int | None = None, lane: Any = None) -> int | None:
    """A call of the job's begins (an actor's method, a framework's phase): noted, never raising into it."""
    p = _process
    try:
        assert p is not None, "no hook installed"  # (a plugin's call before the hooks: said once below)
        if actor is not None and not p.actor_id:
            p.entering_actor(actor)
        return p.activity.enter_call(name, step, lane)
    except Exception as e:
        say_once("noting a call", e)
        return None


def end(token: int | None) -> None:
    if token is not None:
        try:
            assert _process is not None, "no hook installed"
            _process.activity.leave(token)
        except Exception as e:
            say_once("noting the end of a call", e)


def _patch_actor_methods(p: WatchedProcess) -> None:
    from ray._private.function_manager import FunctionActorManager

    load = FunctionActorManager.load_actor_class

    @functools.wraps(load)
    def load_actor_class(self, *args, **kwargs):
        actor_class = load(self, *args, **kwargs)
        try:  # in the actor's creation, before any of its methods runs: who it is, so that they need not ask
            p.entering_actor_class(actor_class.__name__)
        except Exception as e:
            say_once("reading which actor this worker hosts", e)
        return actor_class

    FunctionActorManager.load_actor_class = load_actor_class  # type: ignore[method-assign]  # (Ray's, wrapped)
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
                entered_async(coro, method_name)  # what it does inside (a request, a queue's wait) is in it
                try:
                    return await coro
                finally:
                    end(token)
        elif method_name == "__init__":
            def run(__ray_actor, *args, **kwargs):
                token = begin(method_name, __ray_actor)
                try:
                    out = executor(__ray_actor, *args, **kwargs)
                finally:
                    end(token)
                try:
                    p.initialized(__ray_actor)
                except Exception as e:
                    say_once("reading the roles of a fused actor", e)
                return out
        else:  # at every call of the job: the least there is (Activity.tracked)
            run = p.activity.tracked(method_name, executor)
        run.name, run.method = executor.name, executor.method  # what Ray's task executor reads
        run.__wrapped__ = executor  # (what bench/bench_ray_watch.py puts back, to time the job without)
        return run

    FunctionActorManager._make_actor_method_executor = make_executor  # type: ignore[method-assign]  # (Ray's)


def _patch_tasks(p: WatchedProcess) -> None:
    """A task of the job's (a remote function's call, not an actor's) as a call of its worker's, at the cost of a
    tracked method; one that runs long makes its worker one of the run's (``WatchedProcess.task_begins``)."""
    from ray._private.function_manager import FunctionActorManager

    get = FunctionActorManager.get_execution_info
    made: dict[Any, tuple[Any, Any]] = {}  # a function's id -> (Ray's execution info, ours with the function wrapped)

    @functools.wraps(get)
    def get_execution_info(self, job_id, function_descriptor):
        info = get(self, job_id, function_descriptor)
        try:
            if function_descriptor.is_actor_method():
                return info  # (an actor's: made by _make_actor_method_executor)
            key = function_descriptor.function_id
            if key not in made or made[key][0] is not info:
                made[key] = (info, info._replace(function=_task(p, info.function_name, info.function)))
            return made[key][1]
        except Exception as e:
            say_once("watching a task", e)
            return info

    FunctionActorManager.get_execution_info = get_execution_info  # type: ignore[method-assign]  # (Ray's)


def _task(p: WatchedProcess, function_name: str, function: Any) -> Any:
    """``function`` (a remote function's body) as a call named by its function; a coroutine or a generator's
    function (its calls run on a loop, or yield) is left as it is."""
    if not inspect.isfunction(function) or inspect.iscoroutinefunction(function) or \
            inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        return function
    name = function_name.rpartition(".")[2]
    tracked = p.activity.tracked(name, function)

    @functools.wraps(function)
    def run(*args, **kwargs):
        p.task_begins(name)
        return tracked(*args, **kwargs)

    return run


def _patch_waits(p: WatchedProcess) -> None:
    """``ray.get`` and ``ray.wait`` on the main thread: what they wait for, as a phase or as the detail of
    the phase they are in; a wait on a weight sync, a ``sync``."""
    import ray

    activity = p.activity
    activity.make_wait = p.make_wait
    main, get_ident, wall = threading.main_thread().ident, threading.get_ident, time.time
    for name in ("get", "wait"):
        original = getattr(ray, name)

        # Made on every wait of the job (thousands a second in a job of tiny calls), whose cost here is a cold
        # cache's, several times a hot loop's: a wait is noted (a tuple) and nothing more, and the watcher makes
        # one that lasts a call, with whom it waits on (Activity.main_wait). bench/bench_ray_watch.py times it.
        def waiting(refs, *args, _original=original, _name=f"ray.{name}", **kwargs):
            if get_ident() != main or (p.kind == "worker" and not p.actor_id and p.task is None):
                return _original(refs, *args, **kwargs)  # (a worker before its first actor or task)
            noted = (_name, wall(), refs, kwargs, p.step, p.sync_in_parts)  # (the step and sync as it began)
            outer, error = activity.main_wait, None
            try:
                activity.main_wait = noted
                if activity.asleep:
                    activity.wake()
                return _original(refs, *args, **kwargs)
            except BaseException as e:
                error = e
                raise
            finally:
                activity.main_wait = outer
                if activity.waits_made:  # the watcher made it a call (it lasted): it ends as one
                    try:  # never in place of the job's own result or error
                        activity.wait_ended(noted, error)
                    except Exception as e:
                        say_once("noting the end of a wait", e)

        functools.update_wrapper(waiting, original)
        setattr(ray, name, waiting)
