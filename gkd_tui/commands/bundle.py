"""``gkd-tui bundle``: a bug report in one archive, with the stacks of every worker taken for it."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import msgspec

from gkd_core import rundir
from gkd_core.state import RunState, decode_state
from gkd_core.telemetry import ops
from gkd_core.telemetry.control import ControlError, ControlUnreachable
from gkd_tui.commands.reach import client
from gkd_tui.commands.stacks import take_stacks
from gkd_tui.render_text import status_text


def cmd_bundle(a: argparse.Namespace) -> int:
    from gkd_core.bundle import StacksTaken, write_bundle

    try:
        run = rundir.resolve_run(a.run)
    except rundir.RunNotFound as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 2
    live = False
    try:  # the live state and fresh stacks when the supervisor answers; else what the event log leads to
        c, endpoints = client(run, 2.0)
        with c:
            if a.no_stacks:
                state = decode_state(c.call(ops.SnapshotArgs()).state)
                stacks = StacksTaken(note="not asked for (--no-stacks)")
            else:
                print(f"gkd-tui: taking every worker's stacks for the bundle (up to {a.stacks_timeout:g} s)",
                      file=sys.stderr)
                try:
                    state, stacks = take_stacks(c, endpoints, [], a.stacks_timeout, "bundle")
                except ControlError as e:  # refused (a failed run has no driver to take them): its state is
                    # still the supervisor's, not a replay of the whole log (minutes, for a night's)
                    state = decode_state(c.call(ops.SnapshotArgs()).state)
                    stacks = StacksTaken(note=f"the run did not take them: {e}; the stacks it took before are "
                                              "in stacks/")
        live = True
        status = status_text(state, time.time(), run)
    except (rundir.RunNotFound, ControlUnreachable, ControlError, msgspec.ValidationError) as e:
        state, status = _state_from_log(run)
        status = f"(no live state: {e})\n" + status
        stacks = StacksTaken(note=f"the run did not answer ({e}); the stacks it took before are in stacks/")
    try:
        out = write_bundle(run, Path(a.output) if a.output else None, status, state=state, stacks=stacks, live=live,
                           reread=lambda: _state_now(run),
                           live_taken=(lambda: _live_taken(Path(a.live_taken))) if a.live_taken else None)
    except OSError as e:  # a folder not ours to write, a full disk: said, and where
        print(f"gkd-tui: cannot write the bundle: {e}; give another path with -o", file=sys.stderr)
        return 1
    print(out)
    return 0


def _live_taken(marker: Path) -> None:
    """Said to whoever waits for the live part (the recovery, to restart): ``marker`` made. The archive is
    written after it at a low priority: a new driver may be starting beside it."""
    marker.touch()
    with contextlib.suppress(OSError):
        os.nice(10)


def _state_now(run: Path) -> RunState | None:
    """The run's state now (its supervisor's snapshot), with the workers that joined while the bundle was made;
    None when it does not answer (the bundle keeps the state it had)."""
    try:
        c, _ = client(run, 2.0)
        with c:
            return decode_state(c.call(ops.SnapshotArgs()).state)
    except (rundir.RunNotFound, ControlUnreachable, ControlError, msgspec.ValidationError) as e:
        print(f"gkd-tui: the run's state not read again ({e}): the workers that joined meanwhile are read from "
              "Ray's view alone", file=sys.stderr)
        return None


def _state_from_log(run: Path) -> tuple[RunState, str]:
    """The state ``RUN/events.jsonl`` leads to and its status page at its last event; lines that are
    no event are skipped and said, here and on stderr (a torn last line, after a crash)."""
    from gkd_core.runlog.reader import replay, skipped_note

    path = run / "events.jsonl"
    if not path.is_file():
        return RunState(), f"(no event log at {path})"
    skipped: list[tuple[int, str]] = []
    state = replay(path, skipped)  # a chunk at a time: a day's log need not fit in memory twice
    head = f"from the event log ({state.applied} events"
    if skipped:
        note = skipped_note(path, skipped)
        print(f"gkd-tui: warning: {note}", file=sys.stderr)
        head += f"; {note}"
    return state, f"{head}):\n{status_text(state, state.last_ts, run)}"
