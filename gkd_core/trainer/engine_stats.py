"""A worker's inference engine (a rollout's, a teacher's), counted by the engine itself, on the dashboard.

A thread asks the engine for its counts once a second (``stats()``: vLLM's metrics, read in this
process, so it answers while the engine's processes are busy or frozen) and emits an ``engine``
event when they changed: the worker's details then say "64 running, 0 waiting, KV cache 4 %" beside
"generate for 40 s", and a KV cache at 100 % with requests waiting explains a slow rollout.
"""

from __future__ import annotations

import threading
from typing import Callable

from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter

EVERY_S = 1.0


class EngineStatsWatch:
    def __init__(self, stats: Callable[[], dict], rep: Reporter, every_s: float = EVERY_S):
        self.stats, self.rep, self.every_s = stats, rep, every_s
        self._stop = threading.Event()
        self._last: dict | None = None
        self._thread = threading.Thread(target=self._run, name="gkd-engine-stats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                got = self.stats()
            except Exception as e:  # an engine shutting down, a metric renamed: said once, never the worker's end
                self.rep.log(f"engine stats unreadable, no more will be sent: {type(e).__name__}: {e}"[:300],
                             level="warn")
                return
            if got != self._last:
                self._last = got
                self.rep.emit(ev.EngineEvent(**got))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.every_s)
