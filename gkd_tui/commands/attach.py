"""The commands that open the dashboard: attach (a run, or any Ray job) and replay (a recorded run)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gkd_core import rundir
from gkd_core.telemetry.control import ControlUnreachable
from gkd_tui.commands.reach import EXIT_UNREACHABLE, unreachable
from gkd_tui.render_text import status_text


def cmd_attach_ray(a: argparse.Namespace) -> int:
    """Any Ray job through the state API: the dashboard, or (--plain, or no TTY) one snapshot."""
    from gkd_tui.sources.ray_state import RayStateSource

    source = RayStateSource(a.ray_address)
    if a.plain or not sys.stdout.isatty():
        source.start_once()
        with source.lock:
            print(status_text(source.state, time.time()))
        return EXIT_UNREACHABLE if source.error else 0
    from gkd_tui.app import GkdApp

    GkdApp(source, readonly=True).run()
    return 0


def cmd_attach(a: argparse.Namespace) -> int:
    if a.ray_address:
        return cmd_attach_ray(a)
    run = None
    try:
        run = rundir.resolve_run(a.run)
        if a.plain or not sys.stdout.isatty():
            from gkd_tui.follow import follow

            return follow(run)
        from gkd_tui.app import GkdApp
        from gkd_tui.sources.live import LiveSource

        GkdApp(LiveSource(run), readonly=a.readonly).run()
        print(f"gkd-tui: detached from {run.name}; the run goes on (`gkd-tui attach` to come back)", file=sys.stderr)
        return 0
    except (rundir.RunNotFound, ControlUnreachable) as e:
        return unreachable(run, e)


def cmd_replay(a: argparse.Namespace) -> int:
    from gkd_tui.app import GkdApp
    from gkd_tui.sources.replay import ReplaySource, skipped_note

    try:
        # a path as given, not a run resolved: any recorded log replays, wherever it lies
        path = Path(a.run).expanduser() if a.run else rundir.resolve_run(None)
    except rundir.RunNotFound as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 2
    if path.is_dir():
        path = path / "events.jsonl"
    if not path.is_file():
        print(f"gkd-tui: no event log at {path} (give a run directory or its events.jsonl)", file=sys.stderr)
        return 2
    source = ReplaySource(path)
    if source.skipped and not source.events and not source.state.workers:
        # not one line of what was read is an event: another file, not a run's log
        print(f"gkd-tui: no events in {skipped_note(path, source.skipped)}; give a run directory or its "
              "events.jsonl", file=sys.stderr)
        return 2
    if source.warning():  # before the dashboard takes the screen: still there when it quits
        print(f"gkd-tui: warning: {source.warning()}", file=sys.stderr)
    if a.speed:
        source.speed = a.speed
    GkdApp(source).run()
    return 0
