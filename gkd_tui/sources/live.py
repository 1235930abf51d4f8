"""A live run through the clone pattern: a thread pumps the subscriber into a shared RunState."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from gkd_core.state import RunState
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.control import ControlError, ControlUnreachable
from gkd_tui.sources.log_follower import LogFollower

PUMP_EVENTS = 500


class LiveSource:
    """A ``Source`` with control and logs; no playback, and stacks come through the driver."""

    playback = None
    on_action: Callable[[ev.ActionEvent], None] | None = None  # told of each action that answers a request

    def __init__(self, run: Path):
        self.run: Path | None = run
        self.lock = threading.Condition()
        # the dashboard runs no diagnosis (the supervisor does): it keeps no finished phases
        self.sub = RunSubscriber(run, spans_keep=0)
        self.error = ""
        self.logs = LogFollower(run / "logs")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="gkd-live-source", daemon=True)

    def control(self):
        """A control client of its own for the dashboard's actions (sockets are not shared
        across threads; the pump thread keeps the subscriber's)."""
        from gkd_core.telemetry.control import ControlClient

        assert self.run is not None
        return ControlClient.for_run(self.run, self.sub.endpoints, timeout_s=3.0, by="dashboard")

    @property
    def state(self) -> RunState:
        return self.sub.state

    def now(self) -> float:
        return time.time()

    def describe(self) -> str:
        return "live" + (f" · {self.error}" if self.error else "")

    def start(self) -> None:
        with self.lock:
            self.sub.connect()
        self._thread.start()
        self.logs.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                # a few hundred events at a time under the lock (a batch of a node's heartbeats is
                # one): the redraw waits for the lock at most a few milliseconds
                with self.lock:
                    got = self.sub.pump(0.0, max_events=PUMP_EVENTS)
                    if got:
                        self.lock.notify_all()
                more = len(got) == PUMP_EVENTS
                if self.on_action is not None:
                    for e in got:
                        if type(e) is ev.ActionEvent and e.request:
                            self.on_action(e)
                self.error = ""
            except (ControlUnreachable, ControlError) as e:
                self.error = f"supervisor unreachable: {e}"[:120]
                time.sleep(1.0)
                more = False
            if more:
                # a lock is not fair: released and taken again at once, a redraw waiting for it would
                # wait out a whole burst (20,000 events, 0.15 s); a millisecond lets it in
                time.sleep(0.001)
            else:
                self.sub.sub.poll(100)  # wait for more outside the lock

    def stop(self) -> None:
        self._stop.set()
        self.logs.stop()
        self._thread.join(2)
        self.sub.close()
