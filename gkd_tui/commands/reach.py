"""Reaching a run's supervisor from the command line, and saying so when no run can be reached."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gkd_core import rundir
from gkd_core.telemetry.control import ControlClient, ControlUnreachable

EXIT_UNREACHABLE = 3
LAUNCH_WAIT_S = 30.0  # for a supervisor just started to say where it listens


def client(run: Path, timeout_s: float = 2.0) -> tuple[ControlClient, dict]:
    """A control client for ``run``'s supervisor, and the run's endpoints."""
    endpoints = rundir.read_endpoints(run)
    if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run):
        # no need to wait out the timeout for an answer that cannot come
        raise ControlUnreachable(f"its supervisor (pid {endpoints.get('supervisor_pid', '?')}) is not running")
    client = ControlClient.for_run(run, endpoints, timeout_s=timeout_s, by=f"{os.environ.get('USER', 'cli')}/cli")
    return client, endpoints


def unreachable(run: Path | None, err: Exception) -> int:
    """Say why no run answered and what is left to try (its log, a restart); the exit status for it."""
    where = f" (run directory {run})" if run else ""
    print(f"gkd-tui: no run reachable{where}: {err}", file=sys.stderr)
    if run is not None and (run / "events.jsonl").exists():
        print(f"gkd-tui: its event log is still there: `gkd-tui replay {run}`", file=sys.stderr)
        if rundir.supervisor_pid(run) and not rundir.supervisor_alive(run):
            print(f"gkd-tui: its supervisor (pid {rundir.supervisor_pid(run) or '?'}) is gone: `gkd-tui restart "
                  f"{run}` takes the run over and resumes it from its latest checkpoint", file=sys.stderr)
    return EXIT_UNREACHABLE
