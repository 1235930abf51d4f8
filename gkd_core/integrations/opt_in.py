"""A job started as its user starts it (``python job.py``, ``torchrun ... job.py``), that asks for a run of its own.

``GKD_WATCH=1`` in the job's environment is the opt-in: the first of our hooks to run in the driver
(Ray's runtime-env hook at ``ray.init``, or verl's plugin at ``import verl``) starts a supervisor for
this process, detached (``python -m gkd_core run --adopt PID``), waits for its endpoints, and puts the
run's variables into this process's environment: from then on the job reports exactly as under
``gkd-tui launch --``, and ``gkd-tui attach`` finds it as the latest run. Stopping the run sends the job
SIGTERM, then SIGKILL after the grace period; the supervisor going away leaves the job alone.

Under torchrun (verl's SFT trainer) every rank runs the hook: the ranks of a node make one run
(torchrun.NodeMeeting). Rank 0 starts it, watching torchrun's agent (the ranks' parent: the job, whose
end is the run's end and which ``stop`` signals, so its workers go with it), and the other ranks join
it, each reporting as ``rank/<RANK>``. The ranks of another node make their node's run (torchrun.py
says why they cannot join rank 0's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gkd_core.integrations import job_env, torchrun

WATCH = "GKD_WATCH"
START_WAIT_S = 30.0
# a rank waits for the run its node's first rank starts: that rank's own wait for its supervisor, and as long
# again for it to reach its hook (its imports, on a node where every rank imports at once)
JOIN_WAIT_S = 2 * START_WAIT_S


def wanted(environ=os.environ) -> bool:
    """This process asked for a run of its own, and is not already in one."""
    return environ.get(WATCH) == "1" and not job_env.asked(environ)


def start_run() -> Path:
    """Start the supervisor that watches this process (under torchrun: start or join its node's run); the run's
    variables in ``os.environ``."""
    rank = torchrun.rank_of(os.environ)
    if rank is not None:
        try:
            return _torchrun_run(rank)
        finally:  # asked once: a rank that could not join is not held up again by the next hook (ray.init)
            os.environ.pop(WATCH, None)
    run = _start_supervisor(os.getpid())
    _report_to(run, lead=True)
    _say(f"this job is watched as run {run.name} (`gkd-tui attach`; `gkd-tui stop` stops it)")
    return run


def _torchrun_run(rank: torchrun.Rank) -> Path:
    meeting = torchrun.NodeMeeting(rank)
    # the lead carries the driver's part (the supervisor's command channel): rank 0, or on another node the
    # first of its ranks to claim this round
    lead = rank.rank == 0 if rank.node == 0 else meeting.claim()
    run = meeting.live_run()  # after torchrun restarted its workers: the run they had
    if run is None and lead:
        try:
            run = _start_supervisor(rank.agent)
        except Exception as e:
            meeting.publish_failure(f"{type(e).__name__}: {e}"[:500])
            raise
        meeting.publish(run)
    elif run is None:
        run = meeting.wait_run(JOIN_WAIT_S)
    _report_to(run, lead=lead)
    if lead:
        _say(f"{rank}: this torchrun job is watched as run {run.name}, the ranks of this node as rank/<RANK> "
             "(`gkd-tui attach`; `gkd-tui stop` stops the job)")
        if rank.nodes > 1:  # said by each node's lead, once
            _say(f"{rank}: a run hears the ranks of its own node only (without Ray no authenticated way takes "
                 f"its address and keys to other nodes): this job is {rank.nodes} runs, one per node"
                 + ("" if rank.node == 0 else f"; rank 0's is on its node ({rank.master})"))
    else:
        _say(f"{rank} reports to run {run.name}, started by its node's first rank")
    return run


def _start_supervisor(adopt: int) -> Path:
    """A detached supervisor watching pid ``adopt``; its run directory once its endpoints are written."""
    from gkd_core import rundir

    run_id = rundir.new_run_id()
    home = rundir.gkd_home()
    home.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "gkd_core", "run", "--adopt", str(adopt), "--run-id", run_id,
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
    return run


def _report_to(run: Path, *, lead: bool) -> None:
    """This process reports to ``run`` from now on: what `launch --` gives its command, Ray's runtime-env hook
    included (read by ray.init when it comes); the supervisor's command channel to the lead alone."""
    from gkd_core import rundir

    endpoints = rundir.read_endpoints(run)
    os.environ.update(job_env.command_env(os.environ, run_id=run.name, run_dir=str(run), ingest=endpoints["ingest"],
                                          heartbeat=job_env.heartbeat_s(),
                                          commands=endpoints["driver"] if lead else "",
                                          control=endpoints["control"] if lead else ""))
    for key in (WATCH, *(() if lead else (job_env.COMMANDS, job_env.CONTROL))):
        os.environ.pop(key, None)


def _say(line: str) -> None:
    print(f"gkd: {line}", file=sys.stderr, flush=True)
