"""Any Ray job, instrumented or not, through the Ray state API alone (``attach --ray-address``).

A thread polls actors, running tasks and nodes, one poll at a time with a short timeout, and
turns what it sees into the same events a gkd run sends: an actor is a worker, the method it is
running is its phase, and the task's start time is when the phase began. So a
``RolloutWorker.sync_rollout_weights`` task RUNNING for 412 s shows as that phase for 412 s, in
the same table, alerts and stack viewer as a gkd run. Stacks come from py-spy, for actors on
this machine.

Ray 2.60 turns token authentication on by default: the token sits in ``~/.ray/auth_token`` (or
``RAY_AUTH_TOKEN`` / ``RAY_AUTH_TOKEN_PATH``), but a client sends it only when
``RAY_AUTH_MODE=token``. We set that when a token is at hand, and when access is refused we say
which of them is missing.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from gkd_core import diagnosis
from gkd_core.node.ray_watch import LIMIT, TIMEOUT_S, RayView, poll, poll_placement_groups
from gkd_core.node.stacks import capture_many
from gkd_core.proctree import cpu_seconds
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

# every 2 s, where the driver's watcher asks every 5 (agent.ray_poll_s): here Ray's view is the only
# signal there is, there the workers report themselves and Ray's is the second opinion
POLL_S = 2.0


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


class RayStateSource:
    """A ``Source`` with no control socket (stacks only, no cancel or restart), no logs, no playback."""

    control = None
    playback = None
    logs = None
    run = None

    def __init__(self, address: str = "auto", poll_s: float = POLL_S):
        self.address = address
        self.poll_s = poll_s
        self.lock = threading.Condition()
        self.state = RunState()
        self.error = ""
        self.pg_error = ""  # why placement groups could not be read, said once
        self.polls = 0
        self.truncated = False
        self.view = RayView()  # every actor a worker, its calls its phases
        self._cpu: dict[str, tuple[float, float]] = {}  # worker -> (wall, CPU seconds) at the last poll
        self.auto_stacks = diagnosis.AutoStacks()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gkd-ray-state", daemon=True)

    # --- the source interface ------------------------------------------------------------

    def now(self) -> float:
        return time.time()

    def describe(self) -> str:
        return f"ray state {self.address}" + (f" · {self.error}" if self.error else "") + (
            " · truncated at 10k" if self.truncated else "")

    def start(self) -> None:
        self.start_once()
        self._thread.start()

    def start_once(self) -> None:
        """The first poll, here and now (the plain `attach --ray-address` stops after it)."""
        use_token_if_present()
        self._apply([ev.RunEvent(state="running", reason=f"Ray job(s) at {self.address}, seen through the state API",
                                 run=f"ray:{self.address}")])
        self.poll_once()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(TIMEOUT_S + 1)

    # --- polling ---------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):  # one poll at a time, then a pause: never two at once
            self.poll_once()

    def poll_once(self) -> None:
        try:
            nodes, actors, tasks = poll(self.address, TIMEOUT_S, finished=True)
        except Exception as e:
            what, hint = explain(e, self.address)
            self.error = what
            self._apply([ev.AlertEvent(severity="critical", code="ray_unreachable", message=what, hint=hint)])
            return
        if self.error:
            self.error = ""
            self._apply([ev.AlertEvent(code="ray_unreachable", cleared=True)])
        self.polls += 1
        running = [t for t in tasks if getattr(t, "state", "RUNNING") == "RUNNING"]
        self.truncated = len(actors) >= LIMIT or len(running) >= LIMIT or len(tasks) - len(running) >= LIMIT
        self._apply(self.view.events(nodes, actors, tasks))
        try:  # a state API that fails on these alone: said once, and the rest of the view stands
            self._apply(self.view.placement_groups(poll_placement_groups(self.address, TIMEOUT_S)))
            self.pg_error = ""
        except Exception as e:
            what = f"placement groups unreadable from {self.address}: {type(e).__name__}: {e}"[:300]
            if what != self.pg_error:
                self.pg_error = what
                self._apply([ev.LogEvent(level="warn", message=what)])
        self._apply(self.cpu_samples())
        self.diagnose()

    def diagnose(self) -> None:
        """The same rules as a gkd run's supervisor, on what Ray says; a worker named late gets two
        stacks a few seconds apart (py-spy, on this machine) so the alert can say stuck or busy."""
        with self.lock:
            self._apply_locked(diagnosis.changes(self.state, diagnosis.diagnose(self.state, time.time())))
            due = self.auto_stacks.due(self.state, time.monotonic())
        if due:
            self.capture_stacks(due, f"auto-{self.polls}")
            with self.lock:
                self._apply_locked(diagnosis.changes(self.state, diagnosis.diagnose(self.state, time.time())))

    def cpu_samples(self) -> list[ev.Event]:
        """A heartbeat per local actor from /proc: its CPU share since the last poll. A stopped
        process (state T) sends none, so it reads as frozen, as a gkd worker's silent Reporter does."""
        now = time.time()
        out: list[ev.Event] = []
        with self.lock:
            local = {s: w.pid for s, w in self.state.workers.items()
                     if w.pid and w.phase != "exited" and is_local(w.node)}
        for src, pid in local.items():
            got = cpu_seconds(pid)
            if got is None or got[0] in "TtZ":
                continue
            last = self._cpu.get(src)
            self._cpu[src] = (now, got[1])
            if last is not None and now > last[0]:
                cpu = round(100.0 * (got[1] - last[1]) / (now - last[0]), 1)
                out.append(ev.HeartbeatEvent(src=src, cpu=cpu, ts=now))
        return out

    def _apply(self, events: Iterable[ev.Event]) -> None:
        with self.lock:
            self._apply_locked(events)

    def _apply_locked(self, events: Iterable[ev.Event]) -> None:
        now = time.time()
        for e in events:
            e.run = e.run or f"ray:{self.address}"
            e.ts = e.ts or now
            self.state.apply(e)
        self.lock.notify_all()  # (``sources.wait_for``)

    # --- stacks -------------------------------------------------------------------------

    def capture_stacks(self, targets: list[str], dump_id: str, timeout_s: float = 3.0) -> None:
        """py-spy for the targets on this machine (all when empty); a note for the others."""
        with self.lock:
            workers = {s: w for s, w in self.state.workers.items() if (not targets or s in targets)}
        local = {s: w.pid for s, w in workers.items() if w.pid and is_local(w.node)}
        caps = capture_many(local, timeout_s)
        events = []
        for s, w in workers.items():
            cap = caps.get(s)
            if cap is None:
                events.append(ev.StackEvent(src="gkd-tui", dump_id=dump_id, target=s, error=(
                    f"{s} runs on {w.node or 'another node'}, pid {w.pid}: run `gkd-tui attach --ray-address auto` "
                    f"there, or `py-spy dump --native --pid {w.pid}` on that node")))
            else:
                events.append(ev.StackEvent(src="gkd-tui", dump_id=dump_id, target=s, method=cap.method,
                                            text=cap.text, error=cap.error))
        self._apply(events)
