"""A pytest plugin for the run of verl's own tests under the dashboard's plugin (test_verl_plugin.py loads it
with ``-p verl_probe``): which of gkd's patches are in place in the process that runs those tests, and in
every worker of each worker group they make, asked of each worker itself (Ray's ``__ray_call__``) right after
verl made the group. One JSON line per process, to the file ``VERL_PROBE_OUT`` names.

A patch that failed to install says so only on the job's stderr, and the job runs on unpatched: verl's tests
would pass without ours in place. This is what says they ran with them.
"""

from __future__ import annotations

import itertools
import json
import os
import sys

OUT = "VERL_PROBE_OUT"
# A worker answers in milliseconds once it is up, but verl's group returns before its actors have started:
# four of them importing torch and verl beside CI's vLLM tier on two cores took over a minute (a 60 s bound
# failed there). verl itself waits on its workers with no bound; this is the register center's default.
ASK_S = 300.0
_groups = itertools.count()  # the worker groups made in this run, in order


def _ours(fn) -> str:
    """The module of gkd's that put ``fn`` in place (``verl``, ``ray_hook``), or "" where it is not ours."""
    code = getattr(fn, "__code__", None)
    path = code.co_filename.replace(os.sep, "/") if code is not None else ""
    for module in ("verl", "ray_hook"):
        if path.endswith(f"gkd_core/integrations/{module}.py"):
            return module
    return ""


def patches_here() -> dict:
    """In this process: its part (driver, worker), whether verl loaded our plugin, and who owns each patched
    function."""
    import ray
    from ray._private.function_manager import FunctionActorManager
    from ray.actor import ActorClass, ActorMethod
    from verl.utils.profiler import performance
    from verl.utils.tracking import Tracking

    from gkd_core.integrations import ray_hook

    part = ray_hook.installed()
    return {"pid": os.getpid(), "part": part.kind if part is not None else None,
            "verl_plugin": "gkd_core.integrations.verl" in sys.modules,
            "patched": {"verl _timer": _ours(performance._timer), "verl Tracking.log": _ours(Tracking.log),
                        "ray ActorClass._remote": _ours(ActorClass._remote),
                        "ray ActorMethod._remote": _ours(ActorMethod._remote),
                        "ray.get": _ours(ray.get), "ray.wait": _ours(ray.wait),
                        "ray actor methods": _ours(FunctionActorManager._make_actor_method_executor)}}


def _in_worker(actor) -> dict:  # what ``__ray_call__`` runs in the actor's process, given the actor
    return patches_here()


def _write(record: dict) -> None:
    with open(os.environ[OUT], "a") as f:
        f.write(json.dumps(record) + "\n")


def pytest_configure(config) -> None:
    import ray
    from verl.single_controller.ray.base import RayWorkerGroup

    made = RayWorkerGroup.__init__

    def asked_after_made(self, *args, **kwargs):
        made(self, *args, **kwargs)
        answers = ray.get([w.__ray_call__.remote(_in_worker) for w in self._workers], timeout=ASK_S)
        group = next(_groups)
        for answer in answers:
            _write({"where": "worker", "group": group, **answer})

    RayWorkerGroup.__init__ = asked_after_made


def pytest_sessionfinish(session, exitstatus) -> None:
    _write({"where": "tests", **patches_here()})
