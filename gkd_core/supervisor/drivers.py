"""What a supervisor needs of the job it owns, whatever started it: one ``Driver``, asked the same way for
every kind of job. It starts the job, carries out the requests that are the job's (a cancel, a dump of
stacks, a pause), takes the stacks the diagnosis wants, says what the run is as it starts and whether a
restart may change it. The supervisor never asks which kind it has.

- ``Driver``: our trainer's driver (``python -m MODULE``), which carries out every request itself (its
  stacks through its node agents) and keeps checkpoints;
- ``CommandDriver``: any command (``launch -- COMMAND``), watched through the run's environment
  (gkd_core/integrations): its stacks taken here (``LocalStacks``; those on other nodes by its driver,
  once it has called ``ray.init``), its cancels carried out by its driver (integrations/cancels.py); run
  again as it is by a restart;
- ``AdoptedDriver``: a job its user started that asked for a run of its own (``GKD_WATCH=1``): watched as a
  command is, but only its user can start it, or start it again;
- ``RayClusterDriver``: the jobs of a Ray cluster seen through its state API alone (``attach --ray-address``,
  gkd_core/node/ray_cluster.py): nothing started, nothing to cancel; the stacks of its actors on this node.
"""

from __future__ import annotations

import queue
import re
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec

from gkd_core import config as config_mod
from gkd_core.node.ray_cluster import POLL_S, is_local
from gkd_core.state import RunState
from gkd_core.supervisor import control_ops
from gkd_core.supervisor.control_ops import Asked, Refused
from gkd_core.supervisor.driver_life import DriverLife
from gkd_core.supervisor.driver_process import ClusterWatch
from gkd_core.supervisor.local_stacks import LocalStacks
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Forwarded, Receipt
from gkd_core.trainer import checkpoints


class Reach(NamedTuple):
    """How a driver reaches the job's own driver process (the supervisor's ``DriverLife``)."""

    hand: Callable[[ops.Handed, Asked], Forwarded]  # an op handed to it; Refused when there is none to take it
    alive: Callable[[], bool]  # it runs
    connected: Callable[[], bool]  # it runs and has connected its command channel


class Driver:
    """Our trainer's driver, ``python -m module``."""

    def __init__(self, reach: Reach, module: str):
        self.reach, self.module = reach, module

    def settings(self, cfg: config_mod.Config) -> config_mod.Config:
        """The run's config as this driver's workers keep it (their heartbeats' period, which liveness is judged
        by)."""
        return cfg

    def endpoint_fields(self) -> dict:
        """What a supervisor that takes the run over (its own gone) starts again, in ``endpoints.json``."""
        return {"driver_module": self.module, "command": [], "adopted": 0, "ray_address": ""}

    def start(self, life: DriverLife, cfg: config_mod.Config, config_path: Path) -> None:
        life.start_module(cfg, config_path, self.module)

    def run_said(self, cfg: config_mod.Config, config_source: str) -> tuple[int | None, str]:
        """(its steps in all, if known; where its settings come from) for the run's first event."""
        return cfg.trainer.total_steps, f"config from {config_source}"

    def restart_refusal(self, args: ops.RestartArgs) -> str:
        """Why this restart cannot be made ("" when it can)."""
        return ""

    def steps_lost(self, run_dir: Path, logged: int, killed_pid: int) -> str:
        """What a run taken over says of steps its checkpoints hold and its log does not ("" when none)."""
        return steps_the_log_lost(run_dir, logged, killed_pid)

    def forward(self, args: ops.Handed, asked: Asked, state: RunState) -> Receipt:
        """An op the job's driver carries out: handed to it, its outcome to come as its ``action`` event with the
        request's id; refused at once when it names a worker the run does not have."""
        control_ops.check_targets(ops.OP_OF[type(args)], targets_of(args), state.workers)
        return self.reach.hand(args, asked)

    def cancel(self, args: ops.CancelArgs, asked: Asked, state: RunState) -> Receipt:
        return self.forward(args, asked, state)

    def dump_stacks(self, args: ops.DumpStacksArgs, asked: Asked, state: RunState, unnamed_id: str) -> Receipt:
        """``unnamed_id``: the dump's id when the request names none (our driver names it by the request)."""
        return self.forward(args, asked, state)

    def can_take_stacks(self) -> bool:
        """Whether stacks can be taken now (``take_stacks``): with nobody to ask yet, an alert stands without a
        stack, and they are taken once they can be."""
        return self.reach.connected()

    def take_stacks(self, due: list[str], dump_id: str, state: RunState) -> None:
        """The stacks the diagnosis wants of ``due`` (workers named late)."""
        try:
            self.dump_stacks(ops.DumpStacksArgs(targets=due, dump_id=dump_id), Asked("diagnosis"), state, dump_id)
        except Refused:
            pass  # the driver is exiting: its workers' stacks go with it

    def tick(self, state: RunState, emit: Callable[[ev.Event], None]) -> None:
        """On the supervisor's loop, between its other chores."""


class CommandDriver(Driver):
    """A command of the user's as the run's driver, ``launch -- COMMAND``."""

    def __init__(self, reach: Reach, run_dir: Path, argv: list[str]):
        super().__init__(reach, "")
        self.argv = argv
        # the workers on other nodes: the job's driver captures them there (integrations/remote_stacks.py)
        self.stacks = LocalStacks(run_dir, lambda args: reach.hand(args, Asked("supervisor")))

    def endpoint_fields(self) -> dict:
        return {"driver_module": "", "command": list(self.argv), "adopted": 0, "ray_address": ""}

    def start(self, life: DriverLife, cfg: config_mod.Config, config_path: Path) -> None:
        life.start_command(cfg, self.argv)

    def run_said(self, cfg: config_mod.Config, config_source: str) -> tuple[int | None, str]:
        return None, f"a job of its own, telemetry config from {config_source}"

    def restart_refusal(self, args: ops.RestartArgs) -> str:
        if args.shrink or args.overrides:
            return ("this run's driver is a command of its own (launch -- COMMAND): a restart runs it again as it "
                    "is; to change its settings, stop it and launch it with them")
        return ""

    def steps_lost(self, run_dir: Path, logged: int, killed_pid: int) -> str:
        return ""  # its checkpoints, if any, are its own

    def cancel(self, args: ops.CancelArgs, asked: Asked, state: RunState) -> Receipt:
        """Its driver cancels (gkd_core/integrations/cancels.py), once it has called ray.init."""
        if self.reach.alive() and not self.reach.connected():
            raise Refused("cancel: the job's driver has not called ray.init yet (there is nothing of Ray to cancel); "
                          "`gkd-tui dump-stacks driver` shows where it is")
        return self.forward(args, asked, state)

    def dump_stacks(self, args: ops.DumpStacksArgs, asked: Asked, state: RunState, unnamed_id: str) -> Receipt:
        control_ops.check_targets("dump_stacks", args.targets, state.workers)
        return self.stacks.dump(state, args.targets, args.dump_id or unnamed_id, asked)

    def can_take_stacks(self) -> bool:
        return True  # taken here (those on other nodes: once its driver can be asked, else said why not)

    def take_stacks(self, due: list[str], dump_id: str, state: RunState) -> None:
        self.stacks.dump(state, due, dump_id, Asked("diagnosis"))

    def tick(self, state: RunState, emit: Callable[[ev.Event], None]) -> None:
        self.stacks.hand_over(state, emit)


class AdoptedDriver(CommandDriver):
    """A job its user started, watched by its pid (``GKD_WATCH=1``, gkd_core/integrations/opt_in.py)."""

    def __init__(self, reach: Reach, run_dir: Path, pid: int):
        super().__init__(reach, run_dir, [])
        self.pid = pid

    def endpoint_fields(self) -> dict:
        return {"driver_module": "", "command": [], "adopted": self.pid, "ray_address": ""}

    def start(self, life: DriverLife, cfg: config_mod.Config, config_path: Path) -> None:
        life.adopt(cfg, self.pid)

    def restart_refusal(self, args: ops.RestartArgs) -> str:
        return f"this run watches a job it did not start (pid {self.pid}): restart it as you started it"


class RayClusterDriver(CommandDriver):
    """A Ray cluster's jobs, looked at through its state API (``ClusterWatch``, a look every few seconds)."""

    def __init__(self, reach: Reach, run_dir: Path, address: str):
        super().__init__(reach, run_dir, [])
        self.address = address
        self.looks: queue.SimpleQueue[list[ev.Event]] = queue.SimpleQueue()
        # its actors' nodes are Ray's node addresses: those of this machine are here
        self.stacks = LocalStacks(run_dir, on_this_node=lambda w: is_local(w.node))

    def settings(self, cfg: config_mod.Config) -> config_mod.Config:
        """Its actors' heartbeats come with each look (from /proc), every ``POLL_S`` and a look's time: a
        silence is judged against that, not against a Reporter's second."""
        slower = max(cfg.telemetry.heartbeat_s, POLL_S)
        return msgspec.structs.replace(cfg, telemetry=msgspec.structs.replace(cfg.telemetry, heartbeat_s=slower))

    def endpoint_fields(self) -> dict:
        return {"driver_module": "", "command": [], "adopted": 0, "ray_address": self.address}

    def start(self, life: DriverLife, cfg: config_mod.Config, config_path: Path) -> None:
        life.watch_cluster(cfg, ClusterWatch(self.address, self.looks))

    def run_said(self, cfg: config_mod.Config, config_source: str) -> tuple[int | None, str]:
        return None, f"Ray job(s) at {self.address}, seen through the state API"

    def restart_refusal(self, args: ops.RestartArgs) -> str:
        return (f"this run looks at the Ray cluster at {self.address} from outside: nothing of it is its own to "
                "restart (`gkd-tui stop` ends the looking)")

    def forward(self, args: ops.Handed, asked: Asked, state: RunState) -> Receipt:
        raise Refused(f"'{ops.OP_OF[type(args)]}': this run looks at the Ray cluster at {self.address} from outside, "
                      "through its state API: nothing here carries out requests in its jobs (run a job under "
                      "`gkd-tui launch --` for that); its stacks can be taken (d)")

    def cancel(self, args: ops.CancelArgs, asked: Asked, state: RunState) -> Receipt:
        return self.forward(args, asked, state)

    def tick(self, state: RunState, emit: Callable[[ev.Event], None]) -> None:
        while not self.looks.empty():
            for e in self.looks.get_nowait():
                emit(e)
        super().tick(state, emit)


def driver_of(reach: Reach, run_dir: Path, module: str, command: list[str] | None, adopt: int | None,
              ray_address: str = "") -> Driver:
    """The driver of a run that looks at the Ray cluster at ``ray_address``, or adopts the job ``adopt``, or runs
    ``command``, or else our trainer's ``module``."""
    if ray_address:
        return RayClusterDriver(reach, run_dir, ray_address)
    if adopt:
        return AdoptedDriver(reach, run_dir, adopt)
    if command:
        return CommandDriver(reach, run_dir, command)
    return Driver(reach, module)


def targets_of(args: ops.Args) -> list[str]:
    """The workers a cancel or a dump names."""
    return [args.target] if isinstance(args, ops.CancelArgs) else list(getattr(args, "targets", []))


# how steps_the_log_lost begins, for a reader of the log's steps: "the log lost steps 71-109: ..."
LOST_STEPS = re.compile(r"the log lost steps? (\d+)(?:-(\d+))?: ")


def steps_the_log_lost(run_dir: Path, logged: int, killed_pid: int) -> str:
    """What a run taken over says of steps its newest checkpoint comes after and its log does not have, or "".

    A supervisor killed while behind (a burst, or just thawed from a freeze) takes the events it had
    not written with it, and the driver dies with it: the steps they told of were trained, and the
    newest checkpoint holds them. The log says so, where a reader of its steps finds the hole. The
    checkpoint's own step is not lost: the driver that resumes from it says its metrics again."""
    newest = checkpoints.latest(run_dir / "checkpoints")
    step = checkpoints.step_of(newest) if newest is not None else 0
    if newest is None or step <= logged + 1:
        return ""
    first, last = logged + 1, step - 1
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    return (f"the log lost {span}: checkpoint {newest.name} holds step {step}, and the log has steps only to "
            f"{logged}; they were trained, but supervisor pid {killed_pid or '?'} was gone before it wrote "
            f"their events (killed while it was behind)")
