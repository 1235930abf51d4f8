"""The run's driver process from start to exit, each turn said as a ``run`` event.

Started as the run's ``Driver`` says (supervisor/drivers.py): as our trainer (``python -m DRIVER_MODULE``),
as any command (``launch -- COMMAND``), or not at all: a job its user started and that asked to be
watched is adopted by pid. Watched without
blocking; its exit is the run's end (finished, failed, stopped) unless a restart is pending, which
starts it again with the new config. Commands for it (cancel, stacks) go over its command channel
once it has said hello.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec
import zmq

from gkd_core import config as config_mod
from gkd_core.bundle import environment
from gkd_core.integrations import job_env
from gkd_core.supervisor.control_ops import Asked, Refused
from gkd_core.supervisor.driver_process import AdoptedProcess, ClusterWatch, DriverProcess, describe_exit
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Forwarded
from gkd_core.telemetry.commands import Command

# exit status of `python -m gkd_core run` for a run that was stopped on request (as SIGTERM's)
STOPPED_EXIT = 143


class Job(Protocol):
    """What says how the driver's process starts: the run's ``Driver`` (supervisor/drivers.py)."""

    def start(self, life: DriverLife, cfg: config_mod.Config, config_path: Path) -> None: ...


class DriverLife:
    def __init__(self, *, run_dir: Path, run_id: str, endpoints: dict, drivers: zmq.Socket, job: Job,
                 grace_s: float, restarts: int, emit: Callable[[ev.Event], None]):
        """``job``: the run's driver, which says how its process starts (``Driver.start``)."""
        self.run_dir, self.run_id, self.endpoints, self.drivers = run_dir, run_id, endpoints, drivers
        self.job, self.grace_s = job, grace_s
        self.restarts = restarts
        self.emit = emit
        self.driver: DriverProcess | AdoptedProcess | None = None
        self.identity: bytes | None = None  # its command channel, once it said hello
        self.pending_config: Path | None = None  # a restart's config, until the old driver is gone
        self.stop_reason = ""  # why the run was stopped, when nobody asked (request_stop)
        self.stopping = False
        self.ended_at: float | None = None  # monotonic, when the run ended (the supervisor lingers from there)
        self.exit_status = 0

    def alive(self) -> bool:
        return self.driver is not None and self.driver.poll() is None

    def connected(self) -> bool:
        """It runs, and has connected its command channel: a request can be handed to it."""
        return self.driver is not None and self.identity is not None

    # --- start ---------------------------------------------------------------------------

    def spawn(self, cfg: config_mod.Config, config_path: Path) -> None:
        self.job.start(self, cfg, config_path)

    def start_module(self, cfg: config_mod.Config, config_path: Path, module: str) -> None:
        """Our trainer's driver, ``python -m module``, with the run's config and its endpoints."""
        env = dict(os.environ)
        env.update({
            "GKD_RUN_DIR": str(self.run_dir), "GKD_RUN_ID": self.run_id, "GKD_INGEST": self.endpoints["ingest"],
            "GKD_COMMANDS": self.endpoints["driver"], "GKD_CONTROL": self.endpoints["control"],
            "GKD_CONFIG": str(config_path), "PYTHONUNBUFFERED": "1",
            "GKD_RESTART": str(self.restarts), "GKD_SUPERVISOR_PID": str(os.getpid()),
        })
        argv = [sys.executable, "-m", module, "--config", str(config_path), "--run-dir", str(self.run_dir)]
        self.identity = None
        self.driver = DriverProcess(argv, env, self.run_dir / "logs" / "driver.log")
        self._record(argv, env, "our trainer")
        self.emit(ev.RunEvent(state="running", restart=self.restarts, config_digest=config_mod.digest(cfg),
                              total_steps=cfg.trainer.total_steps, reason=f"driver pid {self.driver.pid}"))

    def adopt(self, cfg: config_mod.Config, pid: int) -> None:
        """A job its user started, watched by its pid: not started, only watched."""
        try:
            self.driver = AdoptedProcess(pid)
        except ProcessLookupError as e:
            self.emit(ev.RunEvent(state="failed", exit_code=0, reason=f"{e}: it ended before its run began"))
            self.ended_at = time.monotonic()
            return
        shown = self._record(self.driver.argv, environment.process_environ(pid), "adopted")
        self.emit(ev.RunEvent(state="running", config_digest=config_mod.digest(cfg),
                              reason=f"watching pid {pid}, started by its user: {shlex.join(shown)}"[:500]))

    def watch_cluster(self, cfg: config_mod.Config, watch: ClusterWatch) -> None:
        """A Ray cluster's jobs, looked at from outside: no process started, ``watch`` looks."""
        self.identity = None
        self.driver = watch
        self._record(watch.argv, {}, "ray cluster")
        self.emit(ev.RunEvent(state="running", config_digest=config_mod.digest(cfg),
                              reason=f"Ray job(s) at {watch.address}, seen through the state API"))

    def start_command(self, cfg: config_mod.Config, command: list[str]) -> None:
        """Any command, its processes watched through the run's environment (integrations/job_env)."""
        env = job_env.command_env(os.environ, run_id=self.run_id, run_dir=str(self.run_dir),
                                  ingest=self.endpoints["ingest"], heartbeat=cfg.telemetry.heartbeat_s,
                                  commands=self.endpoints["driver"], control=self.endpoints["control"])
        env.update({"GKD_RESTART": str(self.restarts), "GKD_SUPERVISOR_PID": str(os.getpid())})
        self.identity = None
        try:
            self.driver = DriverProcess(command, env, self.run_dir / "logs" / "driver.log")
        except OSError as e:  # no such program, not executable: the run fails, said, the supervisor stays
            self.driver = None
            self.exit_status = 127 if isinstance(e, FileNotFoundError) else 126
            self.emit(ev.RunEvent(state="failed", restart=self.restarts, exit_code=self.exit_status,
                                  reason=f"cannot start {shlex.join(environment.redact_argv(command)[0])}: {e}"))
            self.ended_at = time.monotonic()
            return
        shown = self._record(command, env, "command")
        self.emit(ev.RunEvent(state="running", restart=self.restarts, config_digest=config_mod.digest(cfg),
                              reason=f"driver pid {self.driver.pid}: {shlex.join(shown)}"[:500]))

    def _record(self, argv: list[str], env: dict[str, str], how: str) -> list[str]:
        """RUN/driver.json: the command and the variables in effect, for a bug report (secrets hidden); the
        command as it may be shown (a token typed on it hidden: the event log is shared in bug reports too)."""
        assert self.driver is not None  # (said once it started)
        try:
            return environment.record_driver(self.run_dir, argv, env, pid=self.driver.pid, restart=self.restarts,
                                             how=how).argv
        except OSError as e:  # a full disk: the run goes on; its report will say the record is missing
            self.emit(ev.LogEvent(level="warn", message=f"could not write RUN/driver.json: {e}"))
            return environment.redact_argv(argv)[0]

    # --- its life --------------------------------------------------------------------------

    def watch(self, cfg: config_mod.Config, last_words: Callable[[], None]) -> bool:
        """One look, never blocking: a pending restart started, an exit turned into the run's end. True
        when the run has just ended; ``last_words`` first logs what its workers said last."""
        d = self.driver
        if d is None:
            if self.pending_config is not None and not self.stopping:  # a restart after the run ended
                self._start_restart(cfg)
            return False
        d.tick()
        code = d.poll()
        if code is None:
            return False
        self.driver = None
        if self.pending_config is not None and not self.stopping:
            self.emit(ev.RunEvent(state="restarting", restart=self.restarts + 1, exit_code=code,
                                  reason=f"old driver {describe_exit(code)}; starting restart {self.restarts + 1}"))
            self._start_restart(cfg)
            return False
        tail = d.log_tail()
        if self.stopping:
            state, status = "stopped", STOPPED_EXIT
        elif code == 0:
            state, status = "finished", 0
        else:
            state, status = "failed", code if code > 0 else 128 - code
        self.exit_status = status
        last_words()  # the workers' last words before the run's
        said, code = d.exit_said(code)
        reason = said if not (self.stopping and self.stop_reason) else f"{self.stop_reason}; the driver {said}"
        self.emit(ev.RunEvent(state=state, restart=self.restarts, exit_code=code, reason=reason,
                              log_tail=tail if state != "finished" else tail[-3:]))
        self.ended_at = time.monotonic()
        return True

    def restart_with(self, path: Path, grace_s: float) -> None:
        """Start again with the config at ``path`` once the driver is gone (asked to go now, killed after
        ``grace_s``)."""
        self.pending_config = path
        if self.alive():
            assert self.driver is not None  # (alive)
            self.driver.terminate(grace_s)

    def _start_restart(self, cfg: config_mod.Config) -> None:
        self.restarts += 1
        path, self.pending_config = self.pending_config, None
        assert path is not None  # (called only with a restart pending)
        self.ended_at = None
        self.spawn(cfg, path)

    def request_stop(self, grace_s: float | None = None, reason: str = "") -> None:
        """Stop the driver (within ``grace_s``, then killed); ``reason``: why, said in the run's end when not
        asked by a person (the recovery's budget spent)."""
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        self.pending_config = None
        if self.driver is not None:
            self.driver.terminate(self.grace_s if grace_s is None else grace_s)
        elif self.ended_at is None:
            self.ended_at = time.monotonic()

    def kill_now(self) -> None:
        if self.alive():
            assert self.driver is not None  # (alive)
            self.driver.kill_now()

    # --- its command channel ---------------------------------------------------------------

    def serve_hellos(self) -> None:
        for _ in range(100):
            try:
                frames = self.drivers.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2 and frames[1] == b"hello":
                self.identity = frames[0]

    def forward(self, args: ops.Handed, asked: Asked, run_state: str = "") -> Forwarded:
        """``args``' op to the driver, which answers with an ``action`` event carrying the request's id (``asked``);
        Refused when there is no driver to take it."""
        op = ops.OP_OF[type(args)]
        if not self.alive():
            raise Refused(f"'{op}' needs a running driver; the run is {run_state or 'not started'}")
        assert self.driver is not None  # (alive)
        if self.identity is None:
            raise Refused(f"'{op}': the driver (pid {self.driver.pid}) has not connected its command channel; "
                          "it may be hung before init: try `gkd-tui dump-stacks driver`")
        cmd = Command(op=op, args=msgspec.to_builtins(args), by=asked.by, id=asked.id)
        self.drivers.send_multipart([self.identity, msgspec.json.encode(cmd)], zmq.NOBLOCK)
        return Forwarded(to=f"driver pid {self.driver.pid}")
