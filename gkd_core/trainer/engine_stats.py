"""A worker's inference engine (a rollout's, a teacher's), counted by the engine itself, on the dashboard.

A thread asks the engine for its counts once a second (``stats()``: vLLM's metrics, read in this
process, so it answers while the engine's processes are busy or frozen) and emits an ``engine``
event when they changed: the worker's details then say "64 running, 0 waiting, KV cache 4 %" beside
"generate for 40 s", and a KV cache at 100 % with requests waiting explains a slow rollout.

A count the engine no longer has (a metric renamed by another vLLM) is sent as None, shown as unknown,
never as a measured 0; its name is said once, as a warning in the run's log.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter

EVERY_S = 1.0
MISSING = "missing"  # what ``stats()`` may add to the event's fields: the engine's metrics not found


class EngineStatsWatch:
    def __init__(self, stats: Callable[[], dict], rep: Reporter, every_s: float = EVERY_S):
        """``stats()``: the fields of an ``engine`` event (None where unknown), and under ``missing`` the names
        of the engine's metrics it did not find."""
        self.stats, self.rep, self.every_s = stats, rep, every_s
        self._stop = threading.Event()
        self._last: dict | None = None
        self._said_missing: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="gkd-engine-stats", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            if not self.read_once():
                return

    def read_once(self) -> bool:
        """One read of the engine's counts, sent if they changed; False once they cannot be read."""
        try:
            got = dict(self.stats())
        except Exception as e:  # an engine shutting down: said once, never the worker's end
            self.rep.log(f"engine stats unreadable, no more will be sent: {type(e).__name__}: {e}"[:300],
                         level="warn")
            return False
        new = [m for m in got.pop(MISSING, ()) if m not in self._said_missing]
        if new:  # a metric renamed: said once, and its count shown as unknown
            self._said_missing.update(new)
            unknown = sorted(k for k, v in got.items() if v is None)
            self.rep.log(f"engine stats: the engine has no metric {', '.join(new)} (renamed in this version?): "
                         f"{', '.join(unknown)} shown as unknown"[:300], level="warn")
        if got != self._last:
            self._last = got
            self.rep.emit(ev.EngineEvent(**got))
        return True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2 * self.every_s)
