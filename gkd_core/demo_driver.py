"""A light driver that walks through the trainer's phases without torch or Ray.

It stands in for the GKD driver where only the telemetry matters (supervisor tests, benchmarks):
it registers, walks init -> load_data -> (generate, teacher_wait, train, sync_weights) per step,
reports a `sync` per step and `metrics` per step, carries out forwarded commands, and exits 0
after ``trainer.total_steps``. The numbers in its metrics describe its own timing only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

from gkd_core.config import load_config
from gkd_core.lifeline import die_with_supervisor
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Dumped
from gkd_core.telemetry.commands import CommandInbox, DriverCommands, Handler, Reply
from gkd_core.telemetry.pausing import Pause
from gkd_core.telemetry.reporter import Reporter

STEP_PHASES = (("generate", 0.4), ("teacher_wait", 0.15), ("train", 0.3), ("sync_weights", 0.15))


def thread_stacks() -> str:
    """All threads' Python frames, the way faulthandler prints them but from inside."""
    frames = sys._current_frames()
    out = []
    for tid, frame in frames.items():
        out.append(f"Thread {tid:#x}:\n" + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


class DemoCommands(DriverCommands):
    who = "the demo driver (gkd_core.demo_driver)"

    def __init__(self, inbox: CommandInbox, rep: Reporter):
        super().__init__(inbox, rep.emit)
        self.pause = Pause(rep)

    def handlers(self) -> dict[type[ops.Args], Handler]:
        return {ops.DumpStacksArgs: self.dump_stacks, ops.PauseArgs: self.pause.asked,
                ops.ResumeArgs: self.pause.resumed}

    def dump_stacks(self, args: ops.DumpStacksArgs, reply: Reply) -> None:
        dump_id = args.dump_id or f"dump-{reply.cmd.id}"
        self.emit(ev.StackEvent(dump_id=dump_id, target="driver", method="in-process", text=thread_stacks()))
        # the answer, as the trainer's driver gives it: which dump, whose stacks (none saved to files here)
        reply(True, Dumped(dump_id=dump_id, targets=["driver"]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--step-s", type=float, default=float(os.environ.get("GKD_DEMO_STEP_S", "0.2")))
    args = p.parse_args(argv)
    die_with_supervisor()
    cfg = load_config(args.config)
    rep = Reporter("driver", heartbeat_s=cfg.telemetry.heartbeat_s)
    rep.register("driver", 0)
    commands = DemoCommands(CommandInbox(), rep)
    pause, serve_commands = commands.pause, commands.serve_for

    def walk(phase: str, seconds: float, step: int | None = None) -> None:
        with rep.phase(phase, step=step):
            end = time.monotonic() + seconds
            while (left := end - time.monotonic()) > 0:
                serve_commands(min(left, 0.05))

    walk("init", 2 * args.step_s)
    walk("load_data", args.step_s)
    for step in range(1, cfg.trainer.total_steps + 1):
        timing = {}
        for phase, share in STEP_PHASES:
            t = time.monotonic()
            if phase == "sync_weights":
                rep.emit(ev.SyncEvent(sync_id=step, state="started", timeout_s=cfg.trainer.sync_timeout_s,
                                      pending=["driver"], step=step))
            walk(phase, share * args.step_s, step)
            timing[phase.replace("_weights", "").replace("teacher_wait", "teacher")] = time.monotonic() - t
            if phase == "sync_weights":
                rep.emit(ev.SyncEvent(sync_id=step, state="done", timeout_s=cfg.trainer.sync_timeout_s,
                                      elapsed_s=timing["sync"], done=["driver"], fingerprint_ok=True, step=step))
        rep.emit(ev.MetricsEvent(step=step, timing=timing))
        pause.hold(step, serve_commands)
    rep.set_phase("finished")
    rep.close(timeout_s=2.0)
    commands.inbox.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
