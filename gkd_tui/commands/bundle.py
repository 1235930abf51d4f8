"""``gkd-tui bundle``: one archive to share, with the run's status page in it."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import msgspec

from gkd_core import rundir
from gkd_core.state import RunState
from gkd_core.telemetry.control import ControlError, ControlUnreachable
from gkd_tui.commands.reach import client
from gkd_tui.render_text import status_text


def cmd_bundle(a: argparse.Namespace) -> int:
    from gkd_core.bundle import write_bundle

    try:
        run = rundir.resolve_run(a.run)
    except rundir.RunNotFound as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 2
    status = ""
    try:  # the live state when the supervisor answers; else the state the event log leads to
        c, _ = client(run, 2.0)
        with c:
            snap = c.request("snapshot")
        status = status_text(msgspec.convert(snap["state"], RunState), time.time(), run)
    except (rundir.RunNotFound, ControlUnreachable, ControlError) as e:
        status = f"(no live state: {e})\n" + _status_from_log(run)
    out = write_bundle(run, Path(a.output) if a.output else None, status)
    print(out)
    return 0


def _status_from_log(run: Path) -> str:
    """The status page of the state ``RUN/events.jsonl`` leads to, at its last event; lines that are
    no event are skipped and said, here and on stderr (a torn last line, after a crash)."""
    from gkd_core.runlog.reader import replay, skipped_note

    path = run / "events.jsonl"
    if not path.is_file():
        return f"(no event log at {path})"
    skipped: list[tuple[int, str]] = []
    state = replay(path, skipped)  # a chunk at a time: a day's log need not fit in memory twice
    head = f"from the event log ({state.applied} events"
    if skipped:
        note = skipped_note(path, skipped)
        print(f"gkd-tui: warning: {note}", file=sys.stderr)
        head += f"; {note}"
    return f"{head}):\n{status_text(state, state.last_ts, run)}"
