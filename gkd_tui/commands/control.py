"""The commands that ask a run's supervisor: status, stop, restart (or take over a run whose
supervisor is gone), cancel, pause and resume. Each is the scriptable twin of a dashboard key."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import msgspec

from gkd_core import rundir
from gkd_core.state import decode_state
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Answer, Receipt
from gkd_core.telemetry.control import ControlError, ControlUnreachable, new_request_id
from gkd_tui.commands.reach import LAUNCH_WAIT_S, client, unreachable
from gkd_tui.render_text import status_text


def cmd_status(a: argparse.Namespace) -> int:
    run = None
    try:
        run = rundir.resolve_run(a.run)
        c, _ = client(run, a.timeout)
        with c:
            snap = c.call(ops.SnapshotArgs())
    except (rundir.RunNotFound, ControlUnreachable, ControlError) as e:
        return unreachable(run, e)
    try:
        now, state = time.time(), decode_state(snap.state)
    except msgspec.ValidationError as e:  # a supervisor of another version (started before an upgrade)
        print(f"gkd-tui: the supervisor of {run} says its state in a form this gkd-tui does not read ({e}); "
              f"its own version's `gkd-tui status`, or `gkd-tui replay {run}`, reads it", file=sys.stderr)
        return 1
    if a.json:
        view = state.sync_view(now)
        out = {"run_dir": str(run), "seq": snap.seq, "now": now, "supervisor": snap.supervisor,
               "sync_view": msgspec.to_builtins(view) if view else None, "state": msgspec.json.decode(snap.state)}
        json.dump(out, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(status_text(state, now, run))
    return 0


def act(a: argparse.Namespace, args: ops.Answered | ops.Handed, timeout_s: float = 5.0, run: Path | None = None) -> int:
    """The op ``args`` are for, on ``run`` (``a.run`` resolved when not given); its answer printed (as JSON with
    ``--json``): the supervisor's, or its receipt for an op it handed on."""
    op = ops.OP_OF[type(args)]
    try:
        run = run or rundir.resolve_run(a.run)
        c, _ = client(run, timeout_s)
        with c:
            answer: Answer = c.hand(args) if isinstance(args, ops.Handed) else c.call(args)
    except ControlError as e:
        print(f"gkd-tui: {op} refused: {e}", file=sys.stderr)
        return 1
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return unreachable(run, e)
    said = f"{op}: {answer.said()}" if isinstance(answer, Receipt) else answer.said()
    print(json.dumps(msgspec.to_builtins(answer), indent=1) if a.json else said)
    return 0


OUTCOME_WAIT_S = 10.0  # a driver answers between its waits' ticks (a second or less), or between steps


def act_on_driver(a: argparse.Namespace, args: ops.Handed, timeout_s: float = OUTCOME_WAIT_S) -> int:
    """An op the driver carries out (pause, resume): asked, and the driver's answer (an ``action`` event with
    the request's id) heard on the run's event stream, subscribed to before asking so that it cannot be missed;
    printed (as JSON with ``--json``). Exit 1 when it refused or did not answer within ``timeout_s``."""
    op, run = ops.OP_OF[type(args)], None
    try:
        run = rundir.resolve_run(a.run)
        c, endpoints = client(run, 5.0)
        with c:
            sub = RunSubscriber(endpoints=endpoints, client=c)
            try:
                sub.connect()
                request = new_request_id()
                c.hand(args, request_id=request)
                answer = sub.pump_until(lambda state: state.outcome(request), timeout_s)
            finally:
                sub.sub.close(linger=0)  # (the client is closed with it)
    except ControlError as e:
        print(f"gkd-tui: {op} refused: {e}", file=sys.stderr)
        return 1
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return unreachable(run, e)
    if answer is None:
        print(f"gkd-tui: {op}: handed to the driver, which did not answer within {timeout_s:g} s (it answers "
              "between its waits' ticks: is it frozen? `gkd-tui status` says its phase)", file=sys.stderr)
        return 1
    print(json.dumps(msgspec.to_builtins(answer), indent=1) if a.json else answer.said())
    return 0 if answer.ok else 1


def cmd_stop(a: argparse.Namespace) -> int:
    return act(a, ops.StopArgs(grace_s=ops.UNSET if a.grace is None else a.grace))


def cmd_cancel(a: argparse.Namespace) -> int:
    # what is not given takes the op's default (telemetry/ops: the sync, cooperatively)
    args = ops.CancelArgs(mode="force" if a.force else "cooperative")
    if a.target:
        args.target = a.target
    return act(a, args)


def cmd_pause(a: argparse.Namespace) -> int:
    return act_on_driver(a, ops.PauseArgs(for_s=a.for_s) if a.for_s is not None else ops.PauseArgs())


def cmd_resume(a: argparse.Namespace) -> int:
    return act_on_driver(a, ops.ResumeArgs())


def cmd_note(a: argparse.Namespace) -> int:
    return act(a, ops.NoteArgs(text=" ".join(a.text)))


def cmd_restart(a: argparse.Namespace) -> int:
    try:
        run = rundir.resolve_run(a.run)
    except rundir.RunNotFound as e:
        return unreachable(None, e)
    if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run) and (run / "events.jsonl").exists():
        return take_over(run, a)
    return act(a, ops.RestartArgs(shrink=a.smaller, overrides=a.overrides, dry_run=a.dry_run,
                                  grace_s=ops.UNSET if a.grace is None else a.grace), run=run)


def take_over(run: Path, a: argparse.Namespace) -> int:
    """The run's supervisor is gone (killed, its node rebooted): a new one, detached, takes the run
    over. It continues the log and restarts the driver from the latest checkpoint."""
    if a.smaller or a.dry_run:
        print(f"gkd-tui: restart: the supervisor of {run} is gone, and --smaller and --dry-run need it (they "
              "read its diagnosis); restart without them, or with -o KEY=VALUE", file=sys.stderr)
        return 2
    old = rundir.supervisor_pid(run)
    argv = [sys.executable, "-m", "gkd_core", "run", *a.overrides, "--resume", str(run), "--linger", "3600",
            "--quiet"]
    out = open(run / "logs" / "supervisor.log", "ab")
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out.close()
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while rundir.supervisor_pid(run) in (old, 0):
        if proc.poll() is not None or time.monotonic() > deadline:
            print(f"gkd-tui: restart: a new supervisor for {run} did not start within {LAUNCH_WAIT_S:g} s; its "
                  f"output is in {run / 'logs' / 'supervisor.log'}", file=sys.stderr)
            return 1
        time.sleep(0.05)
    print(f"gkd-tui: the supervisor of {run.name} (pid {old or '?'}) was gone; supervisor pid {proc.pid} took the "
          "run over and restarts its driver from the latest checkpoint", file=sys.stderr)
    return 0
