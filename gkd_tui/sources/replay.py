"""A recorded run, replayed through the same reducer: play/pause, step, speed, jump.

The log leaves out the heartbeats of a quiet worker between two it keeps (see
``gkd_core.supervisor.heartbeat_log``); the replay puts them back, copies of the one before at
the run's heartbeat period, so a heartbeat's age reads as it did live. A worker that fell silent
has no later heartbeat in the log to fill up to, and ages as it did.
"""

from __future__ import annotations

import heapq
import itertools
import math
import threading
from pathlib import Path

import msgspec

from gkd_core.state import RunState
from gkd_core.supervisor.heartbeat_log import SILENT_BEATS
from gkd_core.telemetry import events as ev

SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0)
MAX_FILL = 1000  # heartbeats put back per gap at most (a real run's periods give 10 to 50)


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
        self.skipped: list[tuple[int, str]] = []  # (line number, why) of each line that is no event
        # split at newlines only, as the writer does (splitlines would split at a stray \r too, and
        # the numbers would not be the ones an editor shows)
        for n, line in enumerate(path.read_bytes().split(b"\n"), 1):
            if not line.strip():
                continue
            try:
                self.events.append(ev.decode(line))
            except ev.Rejected as r:
                self.skipped.append((n, str(r)))  # a torn last line of a crashed run, say: skip, never fail
        self.state = RunState()
        self.heartbeat_s, self._fill_until = _left_out_heartbeats(self.events)
        self._beats: list = []  # heap of (ts, n, heartbeat to copy, fill until)
        self._n = itertools.count()
        self.cursor = 0  # events[:cursor] are applied
        self.clock = self.events[0].ts if self.events else 0.0
        # the end is the latest ts, not the last line's: workers stamp their own ts, and clocks of
        # several nodes disagree, so the log (in seq order) is not always in ts order
        self._end = max((e.ts for e in self.events), default=0.0)
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
        bad = f" · {len(self.skipped)} bad line(s) skipped" if self.skipped else ""
        return f"replay {mark} {self.speed:g}x · {self.cursor}/{len(self.events)}{bad}"

    def warning(self) -> str:
        """One line on the lines that are no events ("" when none)."""
        note = skipped_note(self.path, self.skipped)
        return f"{note}; replaying the other {len(self.events)} events" if note else ""

    def _apply_until(self, ts: float) -> None:
        events, beats, hb = self.events, self._beats, self.heartbeat_s
        while True:
            due = events[self.cursor].ts if self.cursor < len(events) else math.inf
            if beats and beats[0][0] <= ts and beats[0][0] < due:
                t, _, e, until = heapq.heappop(beats)
                # straight to the last copy due by ``ts``: the ones before it are overwritten by it (a copy
                # changes its worker's heartbeat alone, and its next real one comes at ``until``), so a
                # jump to the end of a 65,536-worker recording applies one copy per gap, not one per beat
                last = t + int((min(ts, until) - t) / hb) * hb
                t = max(t, last - hb if last >= until else last)
                self.state.apply(msgspec.structs.replace(e, ts=t, seq=0, elapsed=e.elapsed + (t - e.ts)))
                if t + hb < until:
                    heapq.heappush(beats, (t + hb, next(self._n), e, until))
                continue
            if due > ts:
                return
            e = events[self.cursor]
            self.state.apply(e)
            for beat, until in self._fill_until.get(self.cursor, ()):
                heapq.heappush(beats, (beat.ts + hb, next(self._n), beat, until))
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
                self.clock = max(self.clock, self._end)
                self._apply_until(self.clock)
            self.playing = False

    def to_start(self) -> None:
        with self.lock:
            self.state = RunState()
            self._beats = []
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


def skipped_note(path: Path, skipped: list[tuple[int, str]]) -> str:
    """One line on the lines of ``path`` that are no events ("" when none): how many, and the first
    one's number and why, so that `sed -n Np` shows it."""
    if not skipped:
        return ""
    n, why = skipped[0]
    why = " ".join(why.split())  # a kind or a message of the file's own may hold line breaks
    more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
    return f"{path}: skipped {len(skipped)} line(s) that are not events: line {n}: {why[:160]}{more}"


def _left_out_heartbeats(events: list) -> tuple[float, dict[int, list[tuple[ev.HeartbeatEvent, float]]]]:
    """(the heartbeat period, {index of a line: [(a heartbeat it logged, ts of the same worker's next
    one)]}) for the gaps the log left out; none in a log that kept every heartbeat. A line is a
    ``heartbeat`` or a ``heartbeats`` batch."""
    periods = next(((e.heartbeat_s, e.heartbeat_log_s) for e in events
                    if type(e) is ev.RunEvent and e.heartbeat_s and e.heartbeat_log_s), None)
    if periods is None:
        return 1.0, {}
    hb, every = periods
    if not (hb > 0 and 0 < every <= MAX_FILL * hb):
        return 1.0, {}  # periods no run has (a hand-made or damaged log): replayed as it is, not filled
    longest = every + (SILENT_BEATS + 1) * hb  # a gap longer than this was a silence
    last: dict[str, tuple[int, ev.HeartbeatEvent]] = {}
    fill: dict[int, list[tuple[ev.HeartbeatEvent, float]]] = {}

    def seen(i: int, e: ev.HeartbeatEvent) -> None:
        before = last.get(e.src)
        if before is not None and 1.5 * hb < e.ts - before[1].ts <= longest:
            fill.setdefault(before[0], []).append((before[1], e.ts))
        last[e.src] = (i, e)

    for i, e in enumerate(events):
        if type(e) is ev.HeartbeatEvent:
            seen(i, e)
        elif type(e) is ev.HeartbeatsEvent:
            for b in e.beats:
                seen(i, ev.heartbeat_of(b))
        elif type(e) is ev.RunEvent and e.state in ("starting", "running", "restarting"):
            last.clear()  # a new driver's workers: no gap to fill across it
    return hb, fill
