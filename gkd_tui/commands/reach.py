"""Reaching a run's supervisor from the command line, and saying so when no run can be reached."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gkd_core import rundir
from gkd_core.errors import GkdError
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


class NotStarted(GkdError, RuntimeError):
    """A supervisor started detached that did not say where it listens in time; the message says where its
    output is."""


def start_detached(run_args: list[str], env: dict[str, str] | None = None) -> tuple[Path, int]:
    """``python -m gkd_core run RUN_ARGS`` in its own session (like tmux: closing the dashboard or the SSH
    session does not stop it), its output in ``$GKD_HOME/supervisor-RUN_ID.log``: (its run directory, its pid)
    once it has published its endpoints, within ``LAUNCH_WAIT_S``."""
    run_id, home = rundir.new_run_id(), rundir.gkd_home()
    home.mkdir(parents=True, exist_ok=True)
    # (its own options first: the caller's may end in `-- COMMAND`)
    argv = [sys.executable, "-m", "gkd_core", "run", "--run-id", run_id, "--quiet", *run_args]
    log = home / f"supervisor-{run_id}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
    run = rundir.runs_root(home) / run_id
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while not (run / "endpoints.json").exists():  # (a file another process writes: nothing to wait on but it)
        if proc.poll() is not None or time.monotonic() > deadline:
            raise NotStarted(f"the supervisor did not start within {LAUNCH_WAIT_S:g} s; its output is in {log}")
        time.sleep(0.05)
    return run, proc.pid
