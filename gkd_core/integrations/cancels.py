"""``cancel`` for a job that is not ours, carried out in its driver (the supervisor cannot call Ray); and
the stacks of its workers on other nodes (remote_stacks).

The supervisor forwards ``cancel`` to the driver's command inbox (``GKD_COMMANDS``), as it does to
our trainer's driver. Here the calls to a worker that the driver is waiting on are cancelled with
``ray.cancel``: a queued call never runs, an async actor's running call is cancelled, and a
regular actor's running call gets Ray's cancellation flag (it goes on unless it checks
``ray.get_runtime_context().is_canceled()``); the driver's ``ray.get`` on it raises
``TaskCancelledError``. ``force`` kills the actor (``ray.kill``): its callers get ``ActorDiedError``.
The outcome is an ``action`` event, on the record like every action.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from gkd_core.integrations import job_env, remote_stacks
from gkd_core.integrations.waits import Wait
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Cancelled
from gkd_core.telemetry.commands import CommandInbox, DriverCommands, Handler, Reply


def start_commands(process: Any, emit: Callable[[ev.Event], None], address: str) -> list[Callable[[list[dict]], None]]:
    """The driver's command inbox started, where the supervisor gave it one (``address``); returns what must
    hear of the cluster's nodes: the stacks helpers it starts on each other node with the job, so that a
    first dump there does not wait for a Ray worker process to start (remote_stacks)."""
    if not address:
        return []
    WatchedCommands(process, emit, address).serve_in_thread()
    return [remote_stacks.HELPERS.start_on]


class WatchedCommands(DriverCommands):
    """A watched job's driver's commands, served on a thread of their own (the job never calls us)."""

    who = "a watched job's driver"

    def __init__(self, process: Any, emit: Callable[[ev.Event], None], address: str):
        super().__init__(CommandInbox(address), emit)
        self.process = process

    def handlers(self) -> dict[type[ops.Args], Handler]:
        return {ops.CancelArgs: self.cancel, ops.RemoteStacksArgs: self.remote_stacks}

    def remote_stacks(self, args: ops.RemoteStacksArgs, reply: Reply) -> None:
        """A helper on each node, awaited in a thread of its own: a cancel meanwhile is not held up. Its stacks
        are the supervisor's dump's (the supervisor says the dump's end): this reply is not awaited."""
        threading.Thread(target=remote_stacks.take, name="gkd-remote-stacks", daemon=True, args=(
            args.targets, args.dump_id, self.process.run, os.environ.get(job_env.RUN_DIR, ""), self.emit)).start()

    def cancel(self, args: ops.CancelArgs, reply: Reply) -> None:
        target, force = args.target, args.mode == "force"
        p = self.process
        wait = p.current_wait  # (read once: the main thread moves on meanwhile, and a Wait made on asking is one)
        wait = wait.resolve() if wait is not None else None
        if target == "sync":
            names = list(wait.pending) if wait is not None and wait.is_sync else []
            if not names:
                reply(False, "the driver waits on no weight sync")
                return
        elif target == "all":
            names = sorted(set(p.actors.names.values()))
        else:
            names = [target]
        outcome = {n: self._cancel(n, force, wait) for n in names}
        reply(all(not o.startswith("no ") for o in outcome.values()),
              Cancelled(target=target, mode=args.mode, outcome=outcome))

    def _cancel(self, name: str, force: bool, wait: Wait | None) -> str:
        import ray

        if force:
            handle = self.process.actors.handle_of(name)
            if handle is None:
                return "no handle to it here (not made by this driver, and not a named actor)"
            ray.kill(handle, no_restart=True)
            return "killed"
        # the calls the driver waits on now (``wait``, resolved): their refs are alive in its ray.get (a ref is
        # not ours to keep alive longer: it would pin its result in the object store)
        book = self.process.book
        refs = [r for r in (wait.refs if wait is not None else []) if (book.who(r) or ("",))[0] == name]
        if not refs:
            return f"no call to {name} is being waited on by the driver"
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        for ref in pending:
            ray.cancel(ref, recursive=False)
        methods = sorted({book.who(r)[1] for r in pending})
        return (f"{len(pending)} pending call(s) cancelled ({', '.join(methods)}); a regular actor's running call "
                "only gets Ray's cancellation flag" if pending else "no call of it was pending")
