"""Whether a node's CPU is held by processes outside the run: the node agent's word for it, said once.

Users' nodes run other work (a data loader, another user's evaluation, the inference server): with
every core taken, a worker that is starting (importing, loading a model) can go seconds without a
heartbeat. That silence is the node's load, not a death, and the diagnosis says so when the node's
agent has said it (``NODE_BUSY``, ``diagnosis.rules.workers``).

Read from /proc (Linux; elsewhere nothing is said): the node's CPU from /proc/stat, each process's
from /proc/PID/stat. The run's processes are those under the node's Ray (the raylet that started the
agent: every worker and its engine's processes), every process carrying this run's id in its
environment (the driver; on a local cluster also the Ray it started) with all under it, and the
process that started the first of those (the supervisor). The rest is outside the run; on a shared
Ray cluster another job's Ray workers count as the cluster's, inside.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the diagnosis reads NODE_BUSY: it need not bring the reporter's sockets in
    from gkd_core.telemetry.reporter import Reporter

NODE_BUSY = "node_busy"  # the agent's phase while its node's CPU is held outside the run (its detail: by whom)
NODE_WATCHING = "watching"  # the agent's phase otherwise
BUSY_SHARE = 0.9  # the node's cores at least this busy over an interval ...
# ... and at least this share of them held by processes outside the run: the run's own processes take their
# turns on the cores with the others, so at its busiest two busy loops of someone else's on two cores hold
# only a quarter of them, and hold them all while the run waits
OUTSIDE_SHARE = 0.2
STILL_BUSY_SHARE, STILL_OUTSIDE_SHARE = 0.75, 0.05  # once said, it holds until under these (no flapping) ...
FREE_SAMPLES = 3  # ... for this many intervals in a row
TOP_NAMED = 3  # the outside processes named, the busiest first ...
TOP_MIN = 0.1  # ... of those that held at least this many cores' worth (not every short-lived command)
RUN_ENV = "GKD_RUN_ID"


class Load(NamedTuple):
    """The node's CPU over one interval, in cores' worth."""

    cores: int
    busy: float
    outside: float  # of ``busy``, by processes outside the run
    top: list[tuple[int, str, float]]  # the outside processes that held most: (pid, name, cores' worth)

    @property
    def held(self) -> bool:
        """Its cores (nearly) all busy, a fair share of them outside the run."""
        return self.busy >= BUSY_SHARE * self.cores and self.outside >= OUTSIDE_SHARE * self.cores

    @property
    def still_held(self) -> bool:
        """Held still, once said: a lower bar, so that a moment's lull does not end it."""
        return self.busy >= STILL_BUSY_SHARE * self.cores and self.outside >= STILL_OUTSIDE_SHARE * self.cores

    def words(self, node: str) -> str:
        named = ", ".join(f"pid {pid} {name} ({100 * used:.0f} %)" for pid, name, used in self.top)
        return (f"node {node}: {self.busy:.1f} of its {self.cores} cores busy, {self.outside:.1f} of them held by "
                f"processes outside this run" + (f" ({named})" if named else "")
                + "; workers here may start slowly and their heartbeats come late")


class _Proc(NamedTuple):
    ppid: int
    name: str
    cpu_s: float


def processes() -> dict[tuple[int, int], _Proc]:
    """Every process now: (pid, start time in ticks) -> its parent, name and CPU seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        name = stat[stat.find("(") + 1:stat.rfind(")")]
        f = stat.rpartition(")")[2].split()
        try:
            out[(int(entry.name), int(f[19]))] = _Proc(int(f[1]), name, (int(f[11]) + int(f[12])) / tick)
        except (IndexError, ValueError):
            continue
    return out


def _node_cpu() -> tuple[int, float, float]:
    """(cores, busy seconds, all seconds) since boot, summed over the cores, from /proc/stat."""
    tick = os.sysconf("SC_CLK_TCK")
    lines = Path("/proc/stat").read_text().splitlines()
    cores = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
    v = [int(x) for x in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    return cores, (sum(v) - v[3] - v[4]) / tick, sum(v) / tick


def _carries_run(pid: int, run_id: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # another user's process, or gone: not ours
        return False
    return f"{RUN_ENV}={run_id}".encode() in env.split(b"\0")


class CpuLoad:
    """``sample()`` returns the node's load over the interval since the call before (None the first time,
    or off Linux). ``ray_root``: the raylet whose processes are the run's (the agent's parent)."""

    def __init__(self, run_id: str, ray_root: int):
        self.run_id, self.ray_root = run_id, ray_root
        self._carrier: dict[tuple[int, int], bool] = {}  # (pid, start) -> carries this run's id (read once)
        self._before: tuple[dict[tuple[int, int], _Proc], float, float] | None = None

    def sample(self) -> Load | None:
        if not os.path.exists("/proc/stat"):
            return None
        procs = processes()
        cores, busy_s, all_s = _node_cpu()
        before, self._before = self._before, (procs, busy_s, all_s)
        if before is None or all_s <= before[2] or cores == 0:
            return None
        prev, busy0, all0 = before
        wall = (all_s - all0) / cores  # the interval, in seconds of one core
        inside = self.run_pids(procs)
        used = {key: p.cpu_s - prev[key].cpu_s if key in prev else p.cpu_s for key, p in procs.items()}
        outside = sorted(((u, key[0], procs[key].name) for key, u in used.items() if key[0] not in inside and u > 0),
                         reverse=True)
        busy = (busy_s - busy0) / wall
        # the processes' times and the node's are read a moment apart: what they add up to may pass the
        # node's busy time by a few clock ticks, which no process outside can have held
        return Load(cores=cores, busy=busy, outside=min(busy, sum(u for u, _, _ in outside) / wall),
                    top=[(pid, name, u / wall) for u, pid, name in outside[:TOP_NAMED] if u / wall >= TOP_MIN])

    def run_pids(self, procs: dict[tuple[int, int], _Proc]) -> set[int]:
        """The run's processes among ``procs`` (``processes()``); an environment is read once per process."""
        self._carrier = {key: self._carrier[key] if key in self._carrier else _carries_run(key[0], self.run_id)
                         for key in procs}
        carriers = {key[0] for key, yes in self._carrier.items() if yes}
        ppid = {key[0]: p.ppid for key, p in procs.items()}
        # the process that started the run's first carrier (the supervisor): itself, not all it started
        starters = {ppid[c] for c in carriers if ppid.get(c) not in carriers}
        children: dict[int, list[int]] = {}
        for pid, parent in ppid.items():
            children.setdefault(parent, []).append(pid)
        inside, frontier = set(), [self.ray_root, *carriers]
        while frontier:
            pid = frontier.pop()
            if pid not in inside:
                inside.add(pid)
                frontier += children.get(pid, [])
        return inside | starters


class NodeLoadWatch:
    """The agent's thread: samples the node every ``interval_s`` and says, once, when its CPU becomes held
    by processes outside the run (the agent's phase ``NODE_BUSY``, its detail saying by whom, and a log
    line), and once when it is free again."""

    def __init__(self, node: str, rep: Reporter, load: CpuLoad, interval_s: float = 2.0):
        self.node, self.rep, self.load, self.interval_s = node, rep, load, interval_s
        self.busy = False
        self.last: Load | None = None
        self._free_in_a_row = 0
        self._named: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"gkd-node-load[{node}]", daemon=True)

    def start(self) -> NodeLoadWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + 1.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                load = self.load.sample()
            except Exception as e:  # a /proc this reader does not know: said once, and the agent goes on
                self.rep.log(f"agent on {self.node}: the node's CPU load cannot be read ({type(e).__name__}: {e})",
                             level="warn")
                if self.busy:  # not left saying a load it no longer reads
                    self.rep.set_phase(NODE_WATCHING)
                return
            if load is not None:
                self.note(load)

    def note(self, load: Load) -> None:
        """One interval's load: the phase changed (and said) only when the node changes state."""
        self.last = load
        if load.held or (self.busy and load.still_held):
            self._free_in_a_row = 0
            named = {pid for pid, _, _ in load.top}
            if not self.busy or named != self._named:  # the detail follows who holds it
                words = load.words(self.node)
                if not self.busy:
                    self.rep.log(words, level="info")
                self.busy, self._named = True, named
                self.rep.set_phase(NODE_BUSY, detail=words[:300])
            return
        self._free_in_a_row += 1
        if self.busy and self._free_in_a_row >= FREE_SAMPLES:
            self.busy, self._named = False, set()
            self.rep.log(f"node {self.node}: its CPU is no longer held outside this run", level="info")
            self.rep.set_phase(NODE_WATCHING)
