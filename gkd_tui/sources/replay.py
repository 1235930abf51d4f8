"""A recorded run, replayed through the same reducer: play/pause, step, speed, jump.

What the state is at a moment of the log (from a keyframe, the thinned heartbeats put back) is the
run log's (``gkd_core.runlog.timeline``); this is the dashboard's part: a clock that plays.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from gkd_core.runlog.reader import skipped_note
from gkd_core.runlog.timeline import Timeline
from gkd_core.telemetry import events as ev

SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0)


class ReplaySource(Timeline):
    """A ``Source`` that is its own playback; nobody to control, no logs to follow."""

    control = None
    logs = None
    on_action: Callable[[ev.ActionEvent], None] | None = None  # (a recording answers no request of this dashboard's)

    def __init__(self, path: Path, keyframes: bool = True):
        """``keyframes=False``: read the log from its start even where keyframes are (to compare)."""
        # a run directory's own log: its folder is the run (for the bundle); a loose file has none
        self.run = path.parent if (path.parent / "config.yaml").exists() else None
        self.lock = threading.Condition()
        self.playing = True
        self.speed = 1.0
        super().__init__(path, keyframes)

    # --- the Source ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _changing(self) -> Iterator[None]:
        """Under the lock, the waits for the state told once it changed (``sources.wait_for``)."""
        with self.lock:
            yield
            self.lock.notify_all()

    @property
    def playback(self) -> ReplaySource:
        return self

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def now(self) -> float:
        return self.clock

    def describe(self) -> str:
        mark = "playing" if self.playing else "paused"
        bad = f" · {len(self.skipped)} bad line(s) skipped" if self.skipped else ""
        if self.read_whole:
            where = f"{self.lines_before + self.cursor}/{self.lines_before + len(self.events)}"
        else:  # the rest of the log is not read yet
            where = f"{self.lines_before + self.cursor} · {100 * self.fraction_read:.0f} % read"
        return f"replay {mark} {self.speed:g}x · {where}{bad}"

    def warning(self) -> str:
        """One line on the lines that are no events and the keyframes not used ("" when none)."""
        notes = []
        note = skipped_note(self.path, self.skipped)
        if note:
            read = f" {self.lines_before + len(self.events)}" if self.read_whole else ""
            notes.append(f"{note}; replaying the other{read} events")
        if self.passed_over:
            more = f" (and {len(self.passed_over) - 1} more)" if len(self.passed_over) > 1 else ""
            notes.append(f"keyframe not used: {self.passed_over[0][:200]}{more}; the log is read from further back")
        return "; ".join(notes)

    def tick(self, wall_dt: float) -> None:
        if not self.playing:
            return
        with self._changing():
            self.clock += wall_dt * self.speed
            self.apply_until(self.clock)
            if self.at_end():
                self.playing = False

    def step(self) -> None:
        with self._changing():
            if self.has_next():
                self.clock = max(self.clock, self.events[self.cursor].ts)
                self.apply_until(self.clock)

    def to_end(self) -> None:
        with self._changing():
            clock = self.clock
            self.goto(math.inf)  # from the newest keyframe, if any is ahead
            self.clock = max(clock, self.newest_ts)
            self.playing = False

    def to_start(self) -> None:
        with self._changing():
            self.rebase(None)
            self.has_next()
            self.clock = self.events[0].ts if self.events else 0.0

    def seek(self, ts: float) -> None:
        """The state as it was at ``ts`` (paused there)."""
        with self._changing():
            self.goto(ts)
        self.playing = False

    def faster(self, up: bool) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 2
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + (1 if up else -1)))]

    def toggle(self) -> None:
        if self.at_end():
            self.to_start()
        self.playing = not self.playing
