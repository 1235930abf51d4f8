"""The commands that open the dashboard: attach (a run, or any Ray job) and replay (a recorded run)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gkd_core import rundir
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.control import ControlError, ControlUnreachable
from gkd_tui.commands.reach import EXIT_UNREACHABLE, NotStarted, client, start_detached, unreachable
from gkd_tui.render_text import status_text


def cmd_attach_ray(a: argparse.Namespace) -> int:
    """Any Ray job through the state API: (--plain, or no TTY) one look, diagnosed, printed; else a run that
    looks every few seconds (a supervisor with the cluster as its driver: supervisor/drivers.py), on the
    dashboard, and stopped when the dashboard is left (its record stays, for `gkd-tui replay`)."""
    if a.plain or not sys.stdout.isatty():
        state, error = look_once(a.ray_address)
        print(status_text(state, time.time()))
        return EXIT_UNREACHABLE if error else 0
    from gkd_core.telemetry import ops
    from gkd_tui.app import GkdApp
    from gkd_tui.sources.live import LiveSource

    try:
        run, _ = start_detached(["--ray-address", a.ray_address])
    except NotStarted as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 1
    try:
        GkdApp(LiveSource(run), readonly=True).run()
    finally:
        try:
            c, _ = client(run, 5.0)
            with c:
                c.call(ops.StopArgs(grace_s=0))
        except (ControlUnreachable, ControlError) as e:
            print(f"gkd-tui: the run looking at the cluster did not stop ({e}): `gkd-tui stop {run}`", file=sys.stderr)
    print(f"gkd-tui: stopped looking at the Ray cluster; what was seen is in {run} (`gkd-tui replay {run}`)",
          file=sys.stderr)
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


def look_once(address: str = "auto") -> tuple[RunState, str]:
    """One look at the Ray cluster at ``address``, diagnosed as a run's supervisor would (a worker named late
    gets its stacks taken, so the alert can say stuck or busy): (the state, why Ray could not be read or "")."""
    from gkd_core import diagnosis
    from gkd_core.node.ray_cluster import ClusterLook, run_name, stacks_of

    look, state = ClusterLook(address), RunState()

    def apply(events: Sequence[ev.Event]) -> None:
        now = time.time()
        for e in events:
            e.run, e.ts = e.run or run_name(address), e.ts or now
            state.apply(e)

    apply(look.first())
    apply(look.look())
    apply(diagnosis.changes(state, diagnosis.diagnose(state, time.time())))
    due = diagnosis.AutoStacks().due(state, time.monotonic())
    if due:
        apply(stacks_of(state, due, "auto-1"))
        apply(diagnosis.changes(state, diagnosis.diagnose(state, time.time())))
    return state, look.error
