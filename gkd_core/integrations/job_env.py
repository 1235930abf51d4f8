"""What a command run by the supervisor finds in its environment, and what its Ray workers are given.

The supervisor sets these for ``launch -- COMMAND`` (``command_env``); every process of the job reads
them (``asked``, ``run_vars``). Nothing here imports Ray.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from gkd_core.telemetry import collectives

REPORT = "GKD_REPORT"  # "1": the processes of this job report to the run the variables below name
RUN_ID, RUN_DIR, INGEST = "GKD_RUN_ID", "GKD_RUN_DIR", "GKD_INGEST"
HEARTBEAT_S = "GKD_HEARTBEAT_S"
COMMANDS = "GKD_COMMANDS"  # the supervisor's command socket, for the driver alone (cancel, stacks)
CONTROL = "GKD_CONTROL"  # the supervisor's control socket, for the driver alone (open_ingest)
# the job's driver, once its part is installed: a process that is neither it nor a Ray worker (a child of
# either: a DataLoader's worker, vLLM's) inherits the run's variables but is not the driver
DRIVER_PID = "GKD_DRIVER_PID"
TRACK_COLLECTIVES = collectives.SWITCH_ENV  # "0": collectives not tracked, the recorder off
RUN_VARS = (REPORT, RUN_ID, RUN_DIR, INGEST, HEARTBEAT_S, DRIVER_PID, TRACK_COLLECTIVES)
# PyTorch's Flight Recorder: each process's collectives, per group (telemetry/collectives.py reads where
# every rank stands from it). On in a watched job unless the job set it (0 turns it off); bench/bench_collectives.py
# measures what it costs
FLIGHT_RECORDER, FLIGHT_RECORDER_ENTRIES = "TORCH_FR_BUFFER_SIZE", "2000"

# Ray reads RAY_RUNTIME_ENV_HOOK in ray.init and passes the job's runtime_env through that function:
# ours adds the run's variables and a worker setup hook. One the user had set is kept and called first.
RAY_HOOK = "RAY_RUNTIME_ENV_HOOK"
USER_RAY_HOOK = "GKD_USER_RUNTIME_ENV_HOOK"
OUR_RAY_HOOK = "gkd_core.integrations.ray_hook.runtime_env_hook"
WORKER_SETUP_HOOK = "gkd_core.integrations.ray_hook.setup_worker"


def asked(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process belongs to a job that a run watches."""
    return environ.get(REPORT) == "1" and bool(environ.get(INGEST)) and bool(environ.get(RUN_ID))


def run_vars(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The variables every process of the job needs to report (what a Ray worker is given)."""
    out = {k: environ[k] for k in RUN_VARS if environ.get(k)}
    out[FLIGHT_RECORDER] = environ.get(FLIGHT_RECORDER, recorder_default(environ))
    return out


def recorder_default(environ: Mapping[str, str]) -> str:
    """The Flight Recorder's buffer a job gets unless it set one: none where collectives are not tracked."""
    return FLIGHT_RECORDER_ENTRIES if collectives.tracking(environ) else "0"


def heartbeat_s(environ: Mapping[str, str] = os.environ) -> float:
    try:
        return min(60.0, max(0.1, float(environ.get(HEARTBEAT_S, "1"))))
    except ValueError:
        return 1.0


def command_env(base: Mapping[str, str], *, run_id: str, run_dir: str, ingest: str, heartbeat: float,
                commands: str = "", control: str = "") -> dict[str, str]:
    """The environment of a command the supervisor starts as the run's driver."""
    env = dict(base)
    env.pop(DRIVER_PID, None)  # a new run's command: its driver is whichever process of it claims first
    env.update({REPORT: "1", RUN_ID: run_id, RUN_DIR: run_dir, INGEST: ingest, HEARTBEAT_S: f"{heartbeat:g}",
                "PYTHONUNBUFFERED": "1"})
    env.setdefault(FLIGHT_RECORDER, recorder_default(env))
    if commands:
        env[COMMANDS] = commands
    if control:
        env[CONTROL] = control
    theirs = env.get(RAY_HOOK, "")
    if theirs and theirs != OUR_RAY_HOOK:
        env[USER_RAY_HOOK] = theirs
    env[RAY_HOOK] = OUR_RAY_HOOK
    return env


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(our arguments, the command after ``--``, untouched by argparse); None when there is no ``--``."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None
