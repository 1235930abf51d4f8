"""Stacks the supervisor takes itself, for a command run (``launch -- COMMAND``).

Our trainer's driver answers ``dump_stacks`` through its node agents; a foreign job has no such
driver, so the supervisor reads the stacks of the job's processes on this node (py-spy, else the
faulthandler file each watched process registered in RUN/stacks). A worker on another node is the
job's driver's to capture (``ask_driver``: integrations/remote_stacks.py asks a helper on that node);
its stacks come back as events, and the dump waits for them up to ``REMOTE_WAIT_S``. In a thread, so
the loop never waits on a capture; what it took comes back as events through ``results``, in the
order the driver's answer has (the stacks, then the ``dump_stacks`` action that says the dump is
complete).
"""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gkd_core.node.stacks import capture_many
from gkd_core.state import RunState, WorkerState
from gkd_core.supervisor.control_ops import Asked
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Dumped, Taking

TIMEOUT_S = 4.0
REMOTE_WAIT_S = 8.0  # from the dump's start: a helper started on another node, then its capture; the CLI waits 10 s


@dataclass
class Awaited:
    """A dump's wait for the stacks of workers on other nodes: those in so far (target -> text, error)."""
    targets: frozenset[str]
    got: dict[str, tuple[str, str]] = field(default_factory=dict)
    all_in: threading.Event = field(default_factory=threading.Event)


class LocalStacks:
    def __init__(self, run_dir: Path, ask_driver: Callable[[ops.RemoteStacksArgs], object] | None = None,
                 on_this_node: Callable[[WorkerState], bool] | None = None):
        """``ask_driver(args)``: hand the stacks of workers on other nodes to the job's driver to take;
        raises (with the reason) when it cannot; None: there is none to ask (their notes say where to look).
        ``on_this_node``: whether a worker runs here (by default: its node is this host's name, as the
        workers of a watched job say it)."""
        self.run_dir = run_dir
        self.ask_driver = ask_driver
        self.host = socket.gethostname()
        self.on_this_node = on_this_node or (lambda w: w.node in (self.host, ""))
        self.results: queue.SimpleQueue[ev.Event] = queue.SimpleQueue()
        self._awaited: dict[str, Awaited] = {}  # dump id -> the other nodes' stacks it waits for
        self._lock = threading.Lock()  # (``_awaited``: filled on the loop, read by the capture's thread)

    def hand_over(self, state: RunState, emit: Callable[[ev.Event], None]) -> None:
        """On the loop: what the captures took since the last look, on the record; the other nodes' stacks come
        in (their events, applied to ``state``), handed to the dumps that wait for them."""
        while not self.results.empty():
            emit(self.results.get_nowait())
        with self._lock:
            for dump_id, awaited in self._awaited.items():
                for t in awaited.targets - awaited.got.keys():
                    if (r := state.stacks.get(t)) is not None and r.dump_id == dump_id:
                        awaited.got[t] = (r.text, r.error)
                if awaited.got.keys() == awaited.targets:
                    awaited.all_in.set()

    def dump(self, state: RunState, targets: list[str], dump_id: str, who: Asked) -> Taking:
        """Start a dump of ``targets`` (every worker when empty) for ``who`` (its end carries their request's
        id); returns at once, with what is under way."""
        workers = {s: w for s, w in state.workers.items()
                   if (s in targets if targets else w.phase != "exited")}
        unknown = [t for t in targets if t not in workers]
        here = {s: w.pid for s, w in workers.items() if w.pid and self.on_this_node(w)}
        remote = {s: w for s, w in workers.items() if s not in here}
        elsewhere = {t: f"no worker named {t}" for t in unknown}
        asked: list[str] = []
        if remote and self.ask_driver is None:
            elsewhere.update({s: f"{s} runs on {w.node or 'another node'}, pid {w.pid}: `py-spy dump --native --pid "
                                 f"{w.pid}` there" for s, w in remote.items()})
        elif remote and self.ask_driver is not None:
            try:
                self.ask_driver(ops.RemoteStacksArgs(dump_id=dump_id, targets={
                    s: ops.Where(w.pid, w.actor_id) for s, w in remote.items()}))
                asked = sorted(remote)
            except Exception as e:
                elsewhere.update({s: f"{s} runs on {w.node}, pid {w.pid}: `py-spy dump --native --pid {w.pid}` there "
                                     f"(the job's driver could not be asked: {e})" for s, w in remote.items()})
        # from the dump's start, not from the end of this node's captures: the CLI waits 10 s in all
        deadline = time.monotonic() + REMOTE_WAIT_S
        if asked:
            with self._lock:
                self._awaited[dump_id] = Awaited(frozenset(asked))
        threading.Thread(target=self._take, args=(here, asked, elsewhere, dump_id, who, deadline),
                         name=f"gkd-stacks[{dump_id}]", daemon=True).start()
        # not the answer (that is the action `_take` records once the stacks are in): what is under way
        return Taking(taking=sorted([*here, *asked, *elsewhere]),
                      by="the supervisor, on this node" + (", and the job's driver on the others" if asked else ""))

    def _take(self, pids: dict[str, int], asked: list[str], notes: dict[str, str], dump_id: str, who: Asked,
              deadline: float) -> None:
        folder = self.run_dir / "stacks" / dump_id
        try:
            folder.mkdir(parents=True, exist_ok=True)
            caps = capture_many(pids, TIMEOUT_S, faulthandler_dir=self.run_dir / "stacks")
            for target, cap in caps.items():
                (folder / (target.replace("/", "_") + ".txt")).write_text(
                    cap.text + (f"\n# note: {cap.error}\n" if cap.error else ""))
                self.results.put(ev.StackEvent(dump_id=dump_id, target=target, method=cap.method, text=cap.text,
                                               error=cap.error))
            # the other nodes' stacks come as events from the driver's task, handed over on the loop
            got: dict[str, tuple[str, str]] = {}
            if asked:
                awaited = self._awaited[dump_id]
                awaited.all_in.wait(max(0.0, deadline - time.monotonic()))
                with self._lock:
                    got = dict(self._awaited.pop(dump_id).got)
            for t in asked:
                if t not in got:
                    notes[t] = f"no stack from {t}'s node within {REMOTE_WAIT_S:g} s (the job's driver takes it there)"
                    continue
                text, error = got[t]
                (folder / (t.replace("/", "_") + ".txt")).write_text(text + (f"\n# note: {error}\n" if error else ""))
            for target, note in notes.items():
                self.results.put(ev.StackEvent(dump_id=dump_id, target=target, error=note))
            self.results.put(ev.ActionEvent(op="dump_stacks", by=who.by, ok=True, request=who.id, result=Dumped(
                dump_id=dump_id, targets=sorted([*pids, *asked, *notes]), folder=f"stacks/{dump_id}")))
        except Exception as e:  # a full disk, say: the dump fails, on the record; the run goes on
            with self._lock:
                self._awaited.pop(dump_id, None)
            self.results.put(ev.ActionEvent(op="dump_stacks", by=who.by, ok=False, request=who.id, result=Dumped(
                dump_id=dump_id, targets=sorted([*pids, *asked, *notes]), error=f"{type(e).__name__}: {e}"[:300])))
