"""Stacks the supervisor takes itself, for a command run (``launch -- COMMAND``).

Our trainer's driver answers ``dump_stacks`` through its node agents; a foreign job has no such
driver, so the supervisor reads the stacks of the job's processes on this node (py-spy, else the
faulthandler file each watched process registered in RUN/stacks). In a thread, so the loop never
waits on a capture; what it took comes back as events through ``results``, in the order the driver's
answer has (the stacks, then the ``dump_stacks`` action that says the dump is complete).
"""

from __future__ import annotations

import queue
import socket
import threading
from pathlib import Path

from gkd_core.node.stacks import capture_many
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

TIMEOUT_S = 4.0


class LocalStacks:
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.host = socket.gethostname()
        self.results: queue.SimpleQueue[ev.Event] = queue.SimpleQueue()
        self.busy = 0  # dumps under way

    def dump(self, state: RunState, targets: list[str], dump_id: str, by: str) -> dict:
        """Start a dump of ``targets`` (every worker when empty); returns at once."""
        workers = {s: w for s, w in state.workers.items()
                   if (s in targets if targets else w.phase != "exited")}
        unknown = [t for t in targets if t not in workers]
        here = {s: w.pid for s, w in workers.items() if w.pid and w.node in (self.host, "")}
        elsewhere = {s: f"{s} runs on {w.node}, pid {w.pid}: `py-spy dump --native --pid {w.pid}` there"
                     for s, w in workers.items() if s not in here}
        elsewhere.update({t: f"no worker named {t}" for t in unknown})
        self.busy += 1
        threading.Thread(target=self._take, args=(here, elsewhere, dump_id, by), name=f"gkd-stacks[{dump_id}]",
                         daemon=True).start()
        # not the answer (that is the action `_take` records once the stacks are in): what is under way
        return {"taking": sorted([*here, *elsewhere]), "by": "the supervisor, on this node"}

    def _take(self, pids: dict[str, int], notes: dict[str, str], dump_id: str, by: str) -> None:
        folder = self.run_dir / "stacks" / dump_id
        try:
            folder.mkdir(parents=True, exist_ok=True)
            caps = capture_many(pids, TIMEOUT_S, faulthandler_dir=self.run_dir / "stacks")
            for target, cap in caps.items():
                (folder / (target.replace("/", "_") + ".txt")).write_text(
                    cap.text + (f"\n# note: {cap.error}\n" if cap.error else ""))
                self.results.put(ev.StackEvent(dump_id=dump_id, target=target, method=cap.method, text=cap.text,
                                               error=cap.error))
            for target, note in notes.items():
                self.results.put(ev.StackEvent(dump_id=dump_id, target=target, error=note))
            self.results.put(ev.ActionEvent(op="dump_stacks", by=by, ok=True, result={
                "dump_id": dump_id, "targets": sorted([*pids, *notes]), "folder": f"stacks/{dump_id}"}))
        except Exception as e:  # a full disk, say: the dump fails, on the record; the run goes on
            self.results.put(ev.ActionEvent(op="dump_stacks", by=by, ok=False, result={
                "dump_id": dump_id, "targets": sorted([*pids, *notes]), "error": f"{type(e).__name__}: {e}"[:300]}))
        finally:
            self.busy -= 1
