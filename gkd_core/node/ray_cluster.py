"""Any Ray job, instrumented or not, through the Ray state API alone (``attach --ray-address``).

``ClusterLook`` polls actors, running and finished tasks, nodes and placement groups, and turns what it
sees into the events a gkd run sends: an actor is a worker, the method it is running is its phase, and
the task's start time is when the phase began. So a ``RolloutWorker.sync_rollout_weights`` task RUNNING
for 412 s shows as that phase for 412 s, in the same table, alerts and stack viewer as a gkd run. Each
actor on this machine also gets a heartbeat from /proc (its CPU share since the last look); a stopped
one (state T) gets none, and reads as frozen, as a gkd worker's silent Reporter does.

Two readers: a supervisor whose driver is the cluster (supervisor/drivers.py ``RayClusterDriver``: a
look every ``POLL_S``, its diagnosis and stacks a run's, for the dashboard), and one look diagnosed where
it is asked (``attach --ray-address --plain``, a script's snapshot: gkd_tui/commands/attach.py).

Ray 2.60 turns token authentication on by default: the token sits in ``~/.ray/auth_token`` (or
``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), but a client sends it only when
``RAY_AUTH_MODE=token``. We set that when a token is at hand, and when access is refused we say
which of them is missing.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from gkd_core.node.ray_watch import LIMIT, TIMEOUT_S, RayView, poll, poll_placement_groups
from gkd_core.node.stacks import capture_many
from gkd_core.proctree import cpu_seconds
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

# every 2 s, where the driver's watcher asks every 5 (agent.ray_poll_s): here Ray's view is the only
# signal there is, there the workers report themselves and Ray's is the second opinion
POLL_S = 2.0
STACK_TIMEOUT_S = 3.0


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(path).is_file() if path else (Path.home() / ".ray" / "auth_token").is_file()


def use_token_if_present() -> None:
    """Send the token when there is one (Ray's client does not unless RAY_AUTH_MODE=token)."""
    if "RAY_AUTH_MODE" in os.environ or not token_available():
        return
    try:
        # what `ray.init(address="auto")` does: set the mode and refresh Ray's cached config, which
        # an earlier import of ray in this process has read already
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )

        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    except ImportError:  # another Ray version: the variable alone, read when Ray first loads its config
        os.environ["RAY_AUTH_MODE"] = "token"


def explain(err: Exception, address: str) -> tuple[str, str]:
    """(what happened, what to do) for a failed poll."""
    text = f"{type(err).__name__}: {err}"
    if "InvalidAuthToken" in text or "Authentication" in text or "Unauthorized" in text:
        if not token_available():
            return ("Ray refused: the cluster uses token authentication and there is no token here",
                    "copy the token from the head node (`ray get-auth-token` there) into ~/.ray/auth_token, "
                    "or set RAY_AUTH_TOKEN")
        return ("Ray refused the token found here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)",
                "it belongs to another cluster: take the one `ray get-auth-token` prints on the head node")
    return (f"Ray at {address} did not answer within {TIMEOUT_S:g} s ({text[:160]})",
            "is the cluster up (`ray status`)? with an explicit address, is its dashboard running?")


def is_local(ip: str) -> bool:
    """Whether ``ip`` is one of this machine's addresses: the kernel routes a datagram to its own
    address from that same address (nothing is sent)."""
    if not ip:
        return False
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((ip, 9))
            return s.getsockname()[0] == ip
    except OSError:
        return False


def run_name(address: str) -> str:
    return f"ray:{address}"


class ClusterLook:
    """A Ray cluster's jobs as a gkd run's events, one look at a time (``look``). Not thread-safe: one
    reader, one look at a time."""

    def __init__(self, address: str = "auto"):
        self.address = address
        self.error = ""  # why the newest look failed ("" when it did not)
        self.pg_error = ""  # why placement groups could not be read, said once
        self.looks = 0
        self.truncated = False
        self.view = RayView()  # every actor a worker, its calls its phases
        self._cpu: dict[str, tuple[float, float]] = {}  # worker -> (wall, CPU seconds) at the last look
        self._pids: dict[str, tuple[int, str]] = {}  # worker -> (pid, node) as the view said them

    def first(self) -> list[ev.Event]:
        """The run's start, said before the first look."""
        use_token_if_present()
        return [ev.RunEvent(state="running", reason=f"Ray job(s) at {self.address}, seen through the state API",
                            run=run_name(self.address))]

    def look(self) -> list[ev.Event]:
        """What Ray says now, as events: the workers and their calls, the nodes, the placement groups, the local
        actors' CPU; a critical ``ray_unreachable`` when it does not answer (cleared once it does)."""
        try:
            nodes, actors, tasks = poll(self.address, TIMEOUT_S, finished=True)
        except Exception as err:  # unreachable or refused: said as an alert, with what to do
            what, hint = explain(err, self.address)
            self.error = what
            return [ev.AlertEvent(severity="critical", code="ray_unreachable", message=what, hint=hint)]
        out: list[ev.Event] = []
        if self.error:
            self.error = ""
            out.append(ev.AlertEvent(code="ray_unreachable", cleared=True))
        self.looks += 1
        running = [t for t in tasks if getattr(t, "state", "RUNNING") == "RUNNING"]
        self.truncated = len(actors) >= LIMIT or len(running) >= LIMIT or len(tasks) - len(running) >= LIMIT
        seen = self.view.events(nodes, actors, tasks)
        for said in seen:
            if isinstance(said, ev.WorkerEvent) and said.pid:
                self._pids[said.src] = (said.pid, said.node)
            elif isinstance(said, ev.PhaseEvent) and said.phase == "exited":
                self._pids.pop(said.src, None)
        out += seen
        try:  # a state API that fails on these alone: said once, and the rest of the view stands
            out += self.view.placement_groups(poll_placement_groups(self.address, TIMEOUT_S))
            self.pg_error = ""
        except Exception as err:
            what = f"placement groups unreadable from {self.address}: {type(err).__name__}: {err}"[:300]
            if what != self.pg_error:
                self.pg_error = what
                out.append(ev.LogEvent(level="warn", message=what))
        return out + self.cpu_samples()

    def cpu_samples(self) -> list[ev.Event]:
        """A heartbeat per local actor from /proc: its CPU share since the last look. A stopped process (state
        T) sends none, so it reads as frozen, as a gkd worker's silent Reporter does."""
        now = time.time()
        out: list[ev.Event] = []
        for src, (pid, node) in self._pids.items():
            if not is_local(node):
                continue
            got = cpu_seconds(pid)
            if got is None or got[0] in "TtZ":
                continue
            last = self._cpu.get(src)
            self._cpu[src] = (now, got[1])
            if last is not None and now > last[0]:
                cpu = round(100.0 * (got[1] - last[1]) / (now - last[0]), 1)
                out.append(ev.HeartbeatEvent(src=src, cpu=cpu, ts=now))
        return out


def stacks_of(state: RunState, targets: list[str], dump_id: str,
              timeout_s: float = STACK_TIMEOUT_S) -> list[ev.Event]:
    """py-spy for the targets on this machine (all when empty), as stack events; a note for the others."""
    workers = {s: w for s, w in state.workers.items() if (not targets or s in targets)}
    caps = capture_many({s: w.pid for s, w in workers.items() if w.pid and is_local(w.node)}, timeout_s)
    out: list[ev.Event] = []
    for s, w in workers.items():
        cap = caps.get(s)
        if cap is None:
            out.append(ev.StackEvent(src="gkd-tui", dump_id=dump_id, target=s, error=(
                f"{s} runs on {w.node or 'another node'}, pid {w.pid}: run `gkd-tui attach --ray-address auto` "
                f"there, or `py-spy dump --native --pid {w.pid}` on that node")))
        else:
            out.append(ev.StackEvent(src="gkd-tui", dump_id=dump_id, target=s, method=cap.method, text=cap.text,
                                     error=cap.error))
    return out
