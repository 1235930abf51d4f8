"""Which actor is which: an actor of a watched job is named by its class and the order its creator made
it in (``Learner/3``, the fourth ``Learner`` of the run), whichever process made it.

The creator claims the name's slot in Ray's key-value store (a slot is never taken twice, so two
processes making actors of one class never give out one name) and writes the actor's name under its
id, where the actor itself reads it before it first reports, and where any process waiting on it
reads it once. The handles this process made are kept (weakly) for a cancel's kill.
"""

from __future__ import annotations

import weakref
from typing import Any

from gkd_core.integrations.routes import KV_NAMESPACE
from gkd_core.vocab import src_of


class ActorNames:
    """The names of the actors this process made or met, and the handles it made."""

    def __init__(self, run: str):
        self.run = run
        self.created: dict[str, int] = {}  # class -> actors this process made of it (the next index to try)
        self.names: dict[str, str] = {}  # actor id -> its name, for the actors this process knows
        self.handles: dict[str, weakref.ref] = {}  # name -> the handle this process made (for cancel's kill)
        self.ray_names: dict[str, tuple[str, str | None]] = {}  # name -> (Ray's name, namespace), if named

    def name_created(self, class_name: str, handle: Any, options: dict) -> None:
        """The name of an actor this process just made: the first free ``class_name/N`` of the run (a class made
        inside a function, verl's ``create_colocated_worker_cls.<locals>.WorkerDict``, by its own name)."""
        from ray.experimental.internal_kv import _internal_kv_put

        class_name = class_name.rpartition(".")[2]
        actor_id = handle._ray_actor_id.hex()
        n = self.created.get(class_name, 0)
        # another process may make actors of the same class: a slot is claimed, never taken twice
        while _internal_kv_put(f"{self.run}/slot/{class_name}/{n}", actor_id, overwrite=False,
                               namespace=KV_NAMESPACE):
            n += 1
        self.created[class_name] = n + 1
        name = self.names[actor_id] = src_of(class_name, n)
        self.handles[name] = weakref.ref(handle)
        if options.get("name"):
            self.ray_names[name] = (options["name"], options.get("namespace"))
        _internal_kv_put(f"{self.run}/actor/{actor_id}", self.names[actor_id], namespace=KV_NAMESPACE)

    def name_of(self, actor_id: str) -> str:
        """The name of the actor ``actor_id`` (hex): known here, else from its creator's note (read once)."""
        name = self.names.get(actor_id)
        if name is None:
            from ray.experimental.internal_kv import _internal_kv_get

            got = _internal_kv_get(f"{self.run}/actor/{actor_id}", namespace=KV_NAMESPACE)
            name = self.names[actor_id] = got.decode() if got else f"actor {actor_id[:8]}"
        return name

    def handle_of(self, name: str) -> Any:
        """A handle to the actor ``name``: the one this process made, else by its Ray name."""
        ref = self.handles.get(name)
        handle = ref() if ref is not None else None
        if handle is None and name in self.ray_names:
            import ray

            ray_name, namespace = self.ray_names[name]
            handle = ray.get_actor(ray_name, namespace=namespace)
        return handle
