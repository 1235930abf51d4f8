"""The driver's side of the one-key actions: commands the supervisor forwards (dump stacks, cancel, pause and
resume), served between steps and while any wait is in progress, each recorded as an `action` event."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import ray

from gkd_core.node.agent import gather_stacks
from gkd_core.node.stacks import Capture
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import AnyAnswer, Cancelled, Dumped
from gkd_core.telemetry.commands import CommandInbox, DriverCommands, Handler, Reply
from gkd_core.telemetry.pausing import Pause
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer.cluster import Cluster
from gkd_core.trainer.worker_base import thread_stacks

STACK_DEADLINE_S = 3.0


def best_stack(cap: Capture | None, own: tuple[str, str] | None) -> tuple[str, str, str]:
    """(text, method, note) of one target: the agent's capture when it read something, else what
    the worker's own thread said, else every reason why neither could."""
    if cap is not None and cap.text:
        return cap.text, cap.method, cap.error
    if own is not None and own[0]:
        return own[0], "in-process", cap.error if cap is not None else ""
    reasons = [r for r in (cap.error if cap is not None else "", own[1] if own else "") if r]
    return "", "", "; ".join(reasons)


# the outcome of a command, to whoever asked: (ok, answer) -> an ``action`` event with the request's id
Answer = Callable[[bool, AnyAnswer | str], None]


class Actions(DriverCommands):
    who = "our trainer's driver"

    def __init__(self, cluster: Cluster, rep: Reporter, run_dir: Path, inbox: CommandInbox,
                 cancel_sync: Callable[[Answer], None]):
        """``cancel_sync(answer)``: the weight sync under way is cancelled, and ``answer`` told how it ended
        (cancelled and made again, or over before the cancel took hold, or none under way)."""
        super().__init__(inbox, rep.emit)
        self.cluster, self.rep, self.run_dir = cluster, rep, run_dir
        self.cancel_sync = cancel_sync
        self.pause = Pause(rep)  # held at a step's end (``hold``)

    def handlers(self) -> dict[type[ops.Args], Handler]:
        return {ops.DumpStacksArgs: self.dump_stacks, ops.CancelArgs: self.cancel,
                ops.PauseArgs: self.pause.asked, ops.ResumeArgs: self.pause.resumed}

    def serve(self, *_args) -> None:
        """The requests that came, carried out (a wait's tick: none is waited for)."""
        self.serve_for(0.0)

    def hold(self, step: int) -> None:
        """A step's end: held here while a pause is asked for (``telemetry/pausing``), requests served meanwhile."""
        self.pause.hold(step, self.serve_for)

    def dump_stacks(self, args: ops.DumpStacksArgs, answer: Reply) -> None:
        """Every target's stack, two ways at once within one deadline: its node's agent (py-spy with
        native frames, or faulthandler: these work while the process holds the GIL or sits in C), and
        the worker's own thread (which needs the GIL). The agent's answer wins when it has one."""
        c = self.cluster
        dump_id = args.dump_id or f"dump-{answer.cmd.id}"
        wanted = args.targets or ["driver", *c.actors]
        folder = self.run_dir / "stacks" / dump_id
        folder.mkdir(parents=True, exist_ok=True)
        refs = {t: c.actors[t].stacks.remote() for t in wanted if t in c.actors}
        own: dict[str, tuple[str, str]] = {}
        if "driver" in wanted:
            own["driver"] = (thread_stacks(), "")
        caps: dict[str, Capture] = {}
        if c.agents:
            here = ray.get_runtime_context().get_node_id()
            where = {t: (c.info[t]["node_id"], c.info[t]["pid"]) for t in wanted
                     if t in c.info and c.info[t].get("node_id")}
            if "driver" in wanted:
                where["driver"] = (here, os.getpid())
            caps = gather_stacks(c.agents, c.node_labels, where, timeout_s=c.cfg.agent.stack_timeout_s)
        if refs:
            # with agents, the workers' threads have had the agents' whole round to answer already
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0.3 if caps else STACK_DEADLINE_S)
            for t, ref in refs.items():
                if ref in ready:
                    try:
                        own[t] = (ray.get(ref, timeout=1), "")
                    except Exception as e:
                        own[t] = ("", f"{type(e).__name__}: {e}"[:300])
                else:
                    own[t] = ("", f"its own thread did not answer ({c.describe(t)}): it holds the GIL in C "
                                  "or is frozen")
        for t in wanted:
            if t not in caps and t not in own:
                text, method, err = "", "", f"no worker named {t}"
            else:
                text, method, err = best_stack(caps.get(t), own.get(t))
                if not text and not c.agents:
                    err += f"; try `py-spy dump --native --pid {c.info.get(t, {}).get('pid', '?')}` on its node"
            (folder / (t.replace("/", "_") + ".txt")).write_text(text + (f"\n# note: {err}\n" if err else ""))
            self.rep.emit(ev.StackEvent(dump_id=dump_id, target=t, method=method, text=text, error=err))
        answer(True, Dumped(dump_id=dump_id, targets=sorted(wanted), folder=str(folder.relative_to(self.run_dir))))

    def cancel(self, args: ops.CancelArgs, answer: Reply) -> None:
        """``sync``: answered when the sync has ended (``cancel_sync``); a worker or ``all``: once each
        worker has its cancel flag set (or is killed, with ``force``), and for ``all`` the sync's end too.
        ``pid``: only if the worker is still that process."""
        target, mode, pid = args.target, args.mode, args.pid
        actors = self.cluster.actors
        if target == "sync":
            self.cancel_sync(answer)
            return
        names = list(actors) if target == "all" else [target]
        missing = [n for n in names if n not in actors]
        if missing:
            answer(False, f"no worker named {', '.join(missing)}; workers: {', '.join(actors)}")
            return
        now = self.cluster.info.get(target, {}).get("pid")
        if pid and now != pid:
            answer(False, f"{target} is {f'pid {now}' if now else 'being started again'} now, not pid {pid}: not "
                          "cancelled")
            return
        for n in names:
            if mode == "force":
                ray.kill(actors[n], no_restart=True)
            else:
                actors[n].cancel.remote()
        answer(True, Cancelled(target=target, mode=mode, outcome="killed" if mode == "force" else "cancel flag set"))
        if target == "all":
            self.cancel_sync(lambda ok, result: answer(ok, result) if ok else None)
