"""The run directory (DESIGN §6): ``$GKD_HOME/runs/<run_id>/`` and the ``latest`` link."""

from __future__ import annotations

import json
import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

from gkd_core.errors import GkdError

SUBDIRS = ("logs", "stacks", "checkpoints", "restarts", "keys")
# A unix socket path must fit in sun_path (108 bytes on Linux, 104 on macOS), with room to spare.
MAX_IPC_PATH = 100


class RunNotFound(GkdError, LookupError):
    """No run where we looked; the message says where that was."""


def gkd_home() -> Path:
    return Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser()


def runs_root(home: Path | None = None) -> Path:
    return (home or gkd_home()) / "runs"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def create_run_dir(home: Path | None = None, run_id: str | None = None) -> Path:
    """Make a private run directory and point ``latest`` at it."""
    root = runs_root(home)
    root.mkdir(parents=True, exist_ok=True)
    run_id = run_id or new_run_id()
    run = root / run_id
    run.mkdir(mode=0o700)
    for sub in SUBDIRS:
        (run / sub).mkdir(mode=0o700)
    point_latest(run)
    return run


def point_latest(run: Path) -> None:
    """Atomically re-point ``runs/latest`` (a relative symlink) at ``run``."""
    link = run.parent / "latest"
    tmp = run.parent / f".latest.{os.getpid()}"
    try:
        tmp.unlink()
    except FileNotFoundError:
        pass
    os.symlink(run.name, tmp)
    os.replace(tmp, link)


def socket_dir(run: Path) -> Path:
    """Where the ipc sockets live: RUN/ itself, or a short private folder when RUN/ is too deep."""
    if len(str(run / "control.sock")) + len("ipc://") <= MAX_IPC_PATH:
        return run
    base = Path(tempfile.gettempdir()) / f"gkd-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    if base.stat().st_uid != os.getuid() or base.stat().st_mode & 0o077:
        raise PermissionError(f"{base} is not a private folder of this user; remove it or set TMPDIR")
    short = base / run.name
    short.mkdir(mode=0o700, exist_ok=True)
    return short


def write_private_json(path: Path, data: dict) -> None:
    """Write JSON readable by this user only (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def resolve_run(arg: str | os.PathLike | None = None) -> Path:
    """A run directory from what the user typed: a run dir, its events.jsonl, a run id, or nothing
    (the latest run on this machine)."""
    if arg:
        p = Path(arg).expanduser()
        if p.name == "events.jsonl" and p.is_file():
            return p.parent
        if p.is_dir():
            return p.resolve()
        by_id = runs_root() / str(arg)
        if by_id.is_dir():
            return by_id.resolve()
        raise RunNotFound(f"no run at {p} (nor a run id under {runs_root()})")
    latest = runs_root() / "latest"
    if not latest.exists():
        raise RunNotFound(
            f"no run on this machine: {latest} does not exist (GKD_HOME={gkd_home()}); "
            "start one with `gkd-tui launch`, or pass a run directory"
        )
    return latest.resolve()


def read_endpoints(run: Path) -> dict:
    """The run's addresses; RunNotFound, saying what is wrong, unless the file holds a ``control``
    and an ``events`` address (what every reader connects to)."""
    path = run / "endpoints.json"
    try:
        data = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise RunNotFound(f"{path} does not exist: the supervisor of this run has not started yet") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunNotFound(f"{path} is not valid JSON ({e}); is the supervisor still writing it?") from None
    bad = [key for key in ("control", "events") if not isinstance(data, dict)
           or not isinstance(data.get(key), str) or not data[key].startswith(("ipc://", "tcp://"))]
    if bad:
        raise RunNotFound(f"{path} has no {' and no '.join(bad)} address (ipc:// or tcp://): not the endpoints "
                          "a supervisor writes; is this a run directory?")
    return data


def _endpoints_file(run: Path) -> dict:
    try:
        data = json.loads((run / "endpoints.json").read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def supervisor_pid(run: Path) -> int:
    """The pid the run's supervisor wrote in endpoints.json, or 0."""
    pid = _endpoints_file(run).get("supervisor_pid")
    return pid if isinstance(pid, int) and pid > 0 else 0


def supervisor_alive(run: Path) -> int:
    """The pid of the run's supervisor unless it is known to be gone (0): its process has ended, or
    its pid now runs another program. A supervisor on another machine (a run directory on a
    shared file system) cannot be seen from here, so it counts as alive."""
    pid = supervisor_pid(run)
    host = _endpoints_file(run).get("host")
    if pid and host and host != socket.gethostname():
        return pid
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes() if pid else b""
    except OSError:
        return 0
    return pid if b"gkd_core" in cmdline else 0


def check_unsupervised(run: Path) -> None:
    """RuntimeError unless ``run`` is a run directory whose supervisor is gone."""
    if not (run / "events.jsonl").exists() or not (run / "restarts").is_dir():
        raise RuntimeError(f"{run} is not a run directory (no events.jsonl and restarts/)")
    pid = supervisor_alive(run)
    if pid:
        raise RuntimeError(f"its supervisor (pid {pid}) is still running: `gkd-tui restart {run}` asks it")


def latest_config(run: Path) -> Path:
    """The config of the run's latest (re)start: ``restarts/NNN.yaml`` with the highest NNN."""
    made = sorted((f for f in (run / "restarts").glob("*.yaml") if f.stem.isdigit()), key=lambda f: int(f.stem))
    if not made:
        raise RuntimeError(f"{run / 'restarts'} holds no NNN.yaml: no config to restart with")
    return made[-1]
