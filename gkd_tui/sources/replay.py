"""A recorded run, replayed through the same reducer: play/pause, step, speed, jump."""

from __future__ import annotations

import threading
from pathlib import Path

from gkd_core.state import RunState
from gkd_core.telemetry import events as ev

SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0)


class ReplaySource:
    """A ``Source`` that is its own playback; nobody to control, no logs to follow."""

    control = None
    logs = None
    capture_stacks = None

    def __init__(self, path: Path):
        self.path = path
        # a run directory's own log: its folder is the run (for the bundle); a loose file has none
        self.run = path.parent if (path.parent / "config.yaml").exists() else None
        self.lock = threading.Lock()
        self.events: list = []
        self.skipped = 0
        for line in path.read_bytes().splitlines():
            if not line.strip():
                continue
            try:
                self.events.append(ev.decode(line))
            except ev.Rejected:
                self.skipped += 1  # a torn last line of a crashed run, say: skip, never fail
        self.state = RunState()
        self.cursor = 0  # events[:cursor] are applied
        self.clock = self.events[0].ts if self.events else 0.0
        self.playing = True
        self.speed = 1.0

    @property
    def playback(self) -> "ReplaySource":
        return self

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def now(self) -> float:
        return self.clock

    def describe(self) -> str:
        mark = "playing" if self.playing else "paused"
        return f"replay {mark} {self.speed:g}x · {self.cursor}/{len(self.events)}"

    def _apply_until(self, ts: float) -> None:
        while self.cursor < len(self.events) and self.events[self.cursor].ts <= ts:
            self.state.apply(self.events[self.cursor])
            self.cursor += 1

    def tick(self, wall_dt: float) -> None:
        if not self.playing or not self.events:
            return
        with self.lock:
            self.clock += wall_dt * self.speed
            self._apply_until(self.clock)
            if self.cursor >= len(self.events):
                self.playing = False

    def step(self) -> None:
        with self.lock:
            if self.cursor < len(self.events):
                self.clock = max(self.clock, self.events[self.cursor].ts)
                self._apply_until(self.clock)

    def to_end(self) -> None:
        with self.lock:
            if self.events:
                self.clock = max(self.clock, self.events[-1].ts)
                self._apply_until(self.clock)
            self.playing = False

    def to_start(self) -> None:
        with self.lock:
            self.state = RunState()
            self.cursor = 0
            self.clock = self.events[0].ts if self.events else 0.0

    def seek(self, ts: float) -> None:
        """The state as it was at ``ts`` (paused there)."""
        self.to_start()
        with self.lock:
            self.clock = ts
            self._apply_until(ts)
        self.playing = False

    def faster(self, up: bool) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 2
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + (1 if up else -1)))]

    def toggle(self) -> None:
        if self.cursor >= len(self.events):
            self.to_start()
        self.playing = not self.playing
