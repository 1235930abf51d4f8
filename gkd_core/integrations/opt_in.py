"""A job started as its user starts it (``python job.py``), that asks for a run of its own.

``GKD_WATCH=1`` in the job's environment is the opt-in: the first of our hooks to run in the driver
(Ray's runtime-env hook at ``ray.init``, or verl's plugin at ``import verl``) starts a supervisor for
this process, detached (``python -m gkd_core run --adopt PID``), waits for its endpoints, and puts the
run's variables into this process's environment: from then on the job reports exactly as under
``gkd-tui launch --``, and ``gkd-tui attach`` finds it as the latest run. Stopping the run sends the job
SIGTERM, then SIGKILL after the grace period; the supervisor going away leaves the job alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gkd_core.integrations import job_env

WATCH = "GKD_WATCH"
START_WAIT_S = 30.0


def wanted(environ=os.environ) -> bool:
    """This process asked for a run of its own, and is not already in one."""
    return environ.get(WATCH) == "1" and not job_env.asked(environ)


def start_run() -> Path:
    """Start the supervisor that watches this process; its run's variables in ``os.environ``."""
    from gkd_core import rundir

    run_id = rundir.new_run_id()
    home = rundir.gkd_home()
    home.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gkd_core", "run", "--adopt", str(os.getpid()), "--run-id", run_id,
            "--linger", "3600", "--quiet"]
    env = {k: v for k, v in os.environ.items() if k not in (WATCH, job_env.RAY_HOOK)}
    with open(home / f"supervisor-{run_id}.log", "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    run = rundir.runs_root(home) / run_id
    deadline = time.monotonic() + START_WAIT_S
    while not (run / "endpoints.json").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:  # the job goes on unwatched: no supervisor may adopt it later
                proc.kill()
                proc.wait(5)
            raise RuntimeError(f"its supervisor did not start within {START_WAIT_S:g} s; its output is in "
                               f"{home / f'supervisor-{run_id}.log'}")
        time.sleep(0.05)
    endpoints = json.loads((run / "endpoints.json").read_text())
    # what `launch --` gives its command, Ray's runtime-env hook included: read by ray.init when it comes
    os.environ.update(job_env.command_env(os.environ, run_id=run_id, run_dir=str(run), ingest=endpoints["ingest"],
                                          heartbeat=job_env.heartbeat_s(), commands=endpoints["driver"],
                                          control=endpoints["control"]))
    os.environ.pop(WATCH, None)
    print(f"gkd: this job is watched as run {run_id} (`gkd-tui attach`; `gkd-tui stop` stops it)", file=sys.stderr,
          flush=True)
    return run
