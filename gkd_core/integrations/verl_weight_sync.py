"""verl's weight sync through its checkpoint engine, said as a sync in parts (part of verl's plugin).

verl 0.9's ``CheckpointEngineManager.update_weights`` (in the trainer's process) runs a sync as steps,
each a method of the manager but the transfer: abort the rollout servers' requests, free their KV cache,
build the sync's process group (prepare, then init_process_group on every worker), send the weights
(``update_weights`` on every trainer and rollout worker) and finalize, restore the KV cache, resume
generation. Each step is a part of the sync (vocab.SYNC_PARTS: pause, release_cache, group, broadcast,
resume_cache, resume), said by the trainer's process as it begins and ends, so that a slow one is named
with its usual time as our trainer's are ("sync 7 (step 6): free the engines' KV cache 41 s on driver,
usually 12 ms"); its waits inside say whom they wait for. The sync itself is said as it starts and ends
(once a step), and the waits inside it are not syncs of their own.

The module is patched when verl imports it (post_import); the naive backend (actor and rollout in one
process) has no steps, and its one wait on ``update_weights`` is a sync as every such wait is.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from typing import Any

from gkd_core.integrations.waits import Wait, env_timeout
from gkd_core.telemetry import events as ev

CHECKPOINT_ENGINE = "verl.checkpoint_engine.base"
# the manager's methods that update_weights calls, and the part of the sync each is
STEPS = {"abort_replicas": "pause", "release_kv_cache_replicas": "release_cache", "build_process_group": "group",
         "resume_kv_cache_replicas": "resume_cache", "resume_generation_replicas": "resume"}
# what follows the group's building, up to the KV cache's return: the weights sent, and the group finalized
AFTER_GROUP = "broadcast"


class SyncInParts:
    """One ``update_weights`` of the manager: the sync's start and end, and its parts, one at a time (a part
    that begins ends the one before)."""

    def __init__(self, process: Any):
        self.p = process
        self.sync_id = Wait.next_sync_id()
        self.step = process.step
        self.started = time.time()
        self.timeout_s = process.sync_timeout_s or env_timeout()
        self.part: str | None = None
        self.part_began = 0.0
        self._say("started")

    def begin(self, part: str) -> None:
        self.end_part()
        self.part, self.part_began = part, time.time()
        self.p.emit(ev.SyncPartEvent(sync_id=self.sync_id, part=part, step=self.step, started=self.part_began))

    def end_part(self) -> None:
        if self.part is not None:
            self.p.emit(ev.SyncPartEvent(sync_id=self.sync_id, part=self.part, state="ended", step=self.step,
                                         started=self.part_began))
            self.part = None

    def over(self, error: BaseException | None) -> None:
        self.end_part()
        if error is None:
            self._say("done")
        else:
            self._say("cancelled" if isinstance(error, (KeyboardInterrupt, asyncio.CancelledError)) else
                      "timed_out" if type(error).__name__ == "GetTimeoutError" else "failed",
                      f"{type(error).__name__}: {error}")

    def _say(self, state: str, error: str = "") -> None:
        self.p.emit(ev.SyncEvent(sync_id=self.sync_id, state=state, timeout_s=self.timeout_s,
                                 elapsed_s=time.time() - self.started, error=error[:300], step=self.step))


def _process():
    from gkd_core.integrations import ray_hook

    return ray_hook.installed()


def _in_part(part: str, after: str | None, method):
    """``method`` (a step of the manager) as a part of the sync under way on its manager, if one is; and as
    the process's phase (its awaits on the servers' calls are no ``ray.get``: the step is what it is in)."""
    from gkd_core.integrations import ray_hook

    def before(self) -> tuple[SyncInParts | None, int | None]:
        sync = getattr(self, "_gkd_sync", None)
        if sync is None:
            return None, None
        sync.begin(part)
        return sync, ray_hook.begin(method.__name__, step=sync.step)

    def done(sync: SyncInParts | None, token: int | None) -> None:
        ray_hook.end(token)
        if sync is not None:
            sync.begin(after) if after else sync.end_part()

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def step(self, *args, **kwargs):
            sync, token = before(self)
            try:
                out = await method(self, *args, **kwargs)
            except BaseException:
                ray_hook.end(token)
                raise
            done(sync, token)
            return out
    else:
        @functools.wraps(method)
        def step(self, *args, **kwargs):
            sync, token = before(self)
            try:
                out = method(self, *args, **kwargs)
            except BaseException:
                ray_hook.end(token)
                raise
            done(sync, token)
            return out
    return step


def _as_sync(method):
    """The manager's ``update_weights`` as one sync, its steps as its parts."""

    @functools.wraps(method)
    async def update_weights(self, *args, **kwargs):
        p = _process()
        if p is None or p.activity.reporter is None or getattr(self, "backend", "") == "naive":
            return await method(self, *args, **kwargs)
        sync = self._gkd_sync = SyncInParts(p)
        p.sync_in_parts = sync.sync_id
        error = None
        try:
            return await method(self, *args, **kwargs)
        except BaseException as e:
            error = e
            raise
        finally:
            self._gkd_sync = None
            p.sync_in_parts = None
            sync.over(error)

    return update_weights


def patch(module) -> None:
    """Patch ``CheckpointEngineManager`` of verl's ``checkpoint_engine.base``, once it is imported. verl's async
    methods are wrapped by its ``auto_await`` (callable with or without ``await``): the coroutine function
    under it is wrapped, and wrapped again the same way."""
    manager = module.CheckpointEngineManager
    auto_await = module.auto_await

    def rewrap(name: str, wrap) -> None:
        attr = manager.__dict__[name]
        raw = getattr(attr, "__wrapped__", None)
        if raw is not None and inspect.iscoroutinefunction(raw):
            setattr(manager, name, auto_await(wrap(raw)))
        else:
            setattr(manager, name, wrap(attr))

    for name, part in STEPS.items():
        rewrap(name, functools.partial(_in_part, part, AFTER_GROUP if part == "group" else None))
    rewrap("update_weights", _as_sync)
