"""A torchrun job's ranks: who each is (torchrun's environment), and where the ranks of one node meet.

torchrun's agent starts one process per rank and gives each ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``GROUP_RANK`` (its node's number), ``GROUP_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``,
``TORCHELASTIC_RUN_ID`` and ``TORCHELASTIC_RESTART_COUNT``. With ``GKD_WATCH=1`` every rank opts in
(opt_in); so that they make one run and not one each, the ranks of a node meet in a file, the
``NodeMeeting``: the rank that starts the run writes it (atomically, 0600) once the run is up, the
others wait for it under ``JOIN_WAIT_S`` and join the run it names.

The meeting is keyed by the process that started the ranks of this node: torchrun's agent, the ranks'
parent (its pid, its start time, this machine's host name and boot id). ``TORCHELASTIC_RUN_ID`` alone
would not do: it is ``none`` unless the user set ``--rdzv-id``, and ``MASTER_PORT`` is the same 29500
job after job, so the file of yesterday's job would match today's. The agent's identity cannot match
a file of another job, and stays the same across torchrun's restarts of its workers: a restarted rank
joins the run its job already has.

Ranks on other nodes: a run takes events on an ipc socket of its own node; only a Ray job has a way
(its token-authenticated control store) to hand the run's tcp address and CurveZMQ keys to other
nodes, and torch's TCPStore at ``MASTER_ADDR:MASTER_PORT`` authenticates nobody, so the keys do not
go there. The ranks of another node therefore meet the same way on their node and make that node's
run (its first rank to claim starts it, watching its node's agent); each says so on stderr, and
docs/your-jobs.md says it: a torchrun job over N nodes is N runs, one per node, rank 0's the first.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from gkd_core import proctree, rundir
from gkd_core.vocab import WorkerId, src_of

ROLE = "rank"  # a rank's worker id is ``rank/<RANK>``: the straggler rule compares the ranks as peers
POLL_S = 0.05


class Rank(NamedTuple):
    """This process as torchrun started it."""

    rank: int
    world_size: int
    node: int  # GROUP_RANK: the node's number in the job; rank 0 is on node 0
    nodes: int  # GROUP_WORLD_SIZE
    job: str  # TORCHELASTIC_RUN_ID ("none" unless --rdzv-id or --standalone set one)
    master: str  # MASTER_ADDR:MASTER_PORT, for what is said
    restart: int  # TORCHELASTIC_RESTART_COUNT: torchrun's round of starting its workers
    agent: int  # the pid of torchrun's agent on this node: the ranks' parent

    def __str__(self) -> str:
        return f"rank {self.rank} of {self.world_size} (node {self.node} of {self.nodes}) of torchrun job {self.job}"


def rank_of(environ: Mapping[str, str] = os.environ) -> Rank | None:
    """This process's rank, when torchrun started it (``TORCHELASTIC_RUN_ID`` and ``RANK`` set); else None."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    try:
        rank, world = int(environ["RANK"]), int(environ["WORLD_SIZE"])
    except (KeyError, ValueError):
        return None

    def number(key: str, default: int) -> int:
        try:
            return int(environ.get(key, default))
        except ValueError:
            return default

    return Rank(rank=rank, world_size=world, node=number("GROUP_RANK", 0), nodes=number("GROUP_WORLD_SIZE", 1),
                job=environ["TORCHELASTIC_RUN_ID"], master=f"{environ.get('MASTER_ADDR', '?')}:"
                f"{environ.get('MASTER_PORT', '?')}", restart=number("TORCHELASTIC_RESTART_COUNT", 0),
                agent=os.getppid())


def driver_src(environ: Mapping[str, str] = os.environ) -> tuple[str, WorkerId]:
    """The src and worker id of a watched job's main process: ``rank/<RANK>`` in a rank torchrun started (its
    ranks are peers, each its own main process), else ``driver``."""
    rank = rank_of(environ)
    if rank is None:
        return "driver", WorkerId("driver", None)
    return src_of(ROLE, rank.rank), WorkerId(ROLE, rank.rank)


def _start_ticks(pid: int) -> int | None:
    fields = proctree.stat_fields(pid)
    return int(fields[19]) if fields else None


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
    except OSError:
        return "noboot"


class NodeMeeting:
    """The ranks of one node of one torchrun job, meeting in ``$GKD_HOME/torchrun/``: who starts the run,
    and the run, once it is up."""

    def __init__(self, rank: Rank, home: Path | None = None):
        self.rank = rank
        self.folder = (home or rundir.gkd_home()) / "torchrun"
        born = _start_ticks(rank.agent)
        if rank.agent <= 1 or born is None:
            raise RuntimeError(f"{rank}: the torchrun agent that started it (its parent) is gone; not watched")
        host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]
        self.machine = f"{host}-{_boot_id()}"
        self.key = f"{self.machine}-{rank.agent}-{born}"
        self.path = self.folder / f"{self.key}.json"

    def _read(self) -> dict:
        try:
            got = json.loads(self.path.read_bytes())
        except (OSError, ValueError):
            return {}
        return got if isinstance(got, dict) else {}

    def live_run(self) -> Path | None:
        """The run this node's ranks report to, while its supervisor is alive (after a restart of the ranks, the
        run of their first round)."""
        run_dir = self._read().get("run_dir")
        if not isinstance(run_dir, str) or not run_dir:
            return None
        run = Path(run_dir)
        return run if (run / "endpoints.json").exists() and rundir.supervisor_alive(run) else None

    def claim(self) -> bool:
        """Whether this rank is the first of this node to claim this round's start (for the nodes without
        rank 0: torchrun's ranks there need not have LOCAL_RANK 0, which virtual local ranks give every one)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            os.close(os.open(self.folder / f"{self.key}.r{self.rank.restart}.claim", os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            return False
        return True

    def publish(self, run: Path) -> None:
        """The run is up: the other ranks of this node may join it."""
        self._write({"run_dir": str(run), "run_id": run.name, "by": str(self.rank), "restart": self.rank.restart})
        self._forget_old_jobs()

    def publish_failure(self, reason: str) -> None:
        """The run could not start: the other ranks of this round stop waiting, and say why."""
        self._write({"failed": reason, "by": str(self.rank), "restart": self.rank.restart})

    def _write(self, data: dict) -> None:
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        rundir.write_private_json(self.path, data)  # a temporary file renamed over it: read whole or not at all

    def wait_run(self, timeout_s: float) -> Path:
        """The run the starting rank publishes; RuntimeError, saying why, when it failed, when torchrun's agent
        is gone, or when nothing came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.live_run()
            if run is not None:
                return run
            said = self._read()
            if said.get("failed") and said.get("restart") == self.rank.restart:
                raise RuntimeError(f"{said.get('by', 'the starting rank')} could not start the run ({said['failed']});"
                                   f" {self.rank} is not watched either")
            if _start_ticks(self.rank.agent) is None:
                raise RuntimeError(f"{self.rank}: the torchrun agent that started it is gone; not watched")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.rank} waited {timeout_s:g} s for the run its node's first rank starts (rank 0 on node 0) "
                    f"and none came to {self.path}; this rank is not watched. Does that rank run with GKD_WATCH=1 "
                    "and import the hook (verl, or ray.init with RAY_RUNTIME_ENV_HOOK)?")
            time.sleep(POLL_S)

    def _forget_old_jobs(self) -> None:
        """The meetings of this machine's torchrun agents that are gone (a file and a claim per job)."""
        for path in self.folder.glob(f"{self.machine}-*"):
            m = re.fullmatch(re.escape(self.machine) + r"-(\d+)-(\d+)\.(json|r\d+\.claim)", path.name)
            if m and _start_ticks(int(m.group(1))) != int(m.group(2)):
                try:
                    path.unlink()
                except OSError:
                    pass
