"""``gkd-tui dump-stacks``: the workers' stacks, grouped as a person reads them."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from gkd_core import rundir
from gkd_core.bundle.report import StacksTaken
from gkd_core.state import RunState
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Dumped
from gkd_core.telemetry.control import ControlClient, ControlError, ControlUnreachable
from gkd_tui.commands.reach import client, unreachable


def cmd_dump_stacks(a: argparse.Namespace) -> int:
    """Ask for the stacks, wait (bounded) until the driver has answered, print them grouped: identical
    stacks together, the odd ones out first. Exit 1 when some could not be taken."""
    from gkd_core.stack_text import group, grouped_report

    run = None
    try:
        run = rundir.resolve_run(a.run)
        c, endpoints = client(run, 5.0)
        with c:
            state, taken = take_stacks(c, endpoints, a.targets, a.timeout, "cli")
    except ControlError as e:
        print(f"gkd-tui: dump-stacks refused: {e}", file=sys.stderr)
        return 1
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return unreachable(run, e)
    named = {t for alert in state.alerts.values() for t in alert.targets}
    groups = group(taken.taken, named)
    if a.json:
        json.dump({"dump_id": taken.dump_id, "folder": taken.folder, "named": sorted(named),
                   "groups": [{"targets": g.targets, "where": g.where, "stack": g.text} for g in groups],
                   "missing": taken.missing, "notes": taken.notes}, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(f"stacks of {len(taken.taken) + len(taken.missing)} worker(s), dump {taken.dump_id}"
              + (f", saved in RUN/{taken.folder}" if taken.folder else ""))
        print(grouped_report(taken.taken, named, {**taken.notes, **taken.missing}))
    return 1 if taken.missing else 0


def take_stacks(c: ControlClient, endpoints: dict, targets: list[str], timeout_s: float,
                by: str) -> tuple[RunState, StacksTaken]:
    """Ask the run for its workers' stacks (``targets``; none: every worker, on every node, with their child
    processes) and wait, bounded, for the driver's answer on the run's event stream (subscribed before
    asking, so nothing is missed): the state then, and what was taken."""
    sub = RunSubscriber(endpoints=endpoints, client=c)
    try:
        sub.connect()
        asked_at = time.time()
        dump_id = f"{by}-{os.getpid()}-{int(asked_at * 1000)}"
        c.hand(ops.DumpStacksArgs(targets=targets, dump_id=dump_id))
        # the driver's answer: every stack it took came before it (None at the deadline)
        answered = sub.pump_until(lambda state: state.dump_answer(dump_id), timeout_s)
        return sub.state, stacks_of_dump(sub.state, dump_id, answered, asked_at, targets, timeout_s)
    finally:
        sub.sub.close(linger=0)  # (the client is the caller's)


def stacks_of_dump(state: RunState, dump_id: str, answered: Dumped | None, asked_at: float, targets: list[str],
                   timeout_s: float) -> StacksTaken:
    """What dump ``dump_id`` took, from the state once the driver answered (``answered``: the dump's end,
    None when it did not come within ``timeout_s``)."""
    said = answered.targets if answered is not None else []
    # the state keeps a worker's newest stack: one the diagnosis took after we asked (its automatic
    # dump can land between ours and our read) is as good an answer
    records = state.dump_records(dump_id)
    records.update({t: r for t, r in state.stacks.items()
                    if r.ts >= asked_at and r.text and t in said and t not in records})
    wanted = said or targets or sorted(records)
    taken = {t: r.text for t, r in records.items() if r.text}
    missing = {t: (records[t].error if t in records else f"no answer within {timeout_s:g} s") for t in wanted
               if t not in taken}
    notes = {t: r.error for t, r in records.items() if r.text and r.error}
    return StacksTaken(dump_id=dump_id, folder=answered.folder if answered is not None else "", taken=taken,
                       missing=missing, notes=notes)

