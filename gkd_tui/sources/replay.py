"""A recorded run, replayed through the same reducer: play/pause, step, speed, jump.

The log leaves out the heartbeats of a quiet worker between two it keeps (see
``gkd_core.supervisor.heartbeat_log``); the replay puts them back, copies of the one before at
the run's heartbeat period, so a heartbeat's age reads as it did live. A worker that fell silent
has no later heartbeat in the log to fill up to, and ages as it did.

A long recording is not read whole. The replay starts from the newest keyframe of the state at or
before the moment it is asked for (``gkd_core.supervisor.keyframes``: the supervisor writes one
each time the log has grown by 32 MB) and decodes the log after it, a few MB at a time, as it
plays: the end of a 10-minute recording of 65,536 workers is a keyframe and the lines after it.
A log without keyframes (a short run, a file on its own) is read whole when opened.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import threading
from array import array
from pathlib import Path

import msgspec

from gkd_core.state import RunState
from gkd_core.supervisor import keyframes as kf
from gkd_core.supervisor.heartbeat_log import SILENT_BEATS
from gkd_core.telemetry import events as ev

SPEEDS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0)
MAX_FILL = 1000  # heartbeats put back per gap at most (a real run's periods give 10 to 50)
CHUNK = 4 << 20  # bytes of log decoded at a time, cut at a line's end
PERIODS_IN = 1000  # the run event with the heartbeat periods is looked for among the log's first lines


class ReplaySource:
    """A ``Source`` that is its own playback; nobody to control, no logs to follow."""

    control = None
    logs = None
    capture_stacks = None

    def __init__(self, path: Path, keyframes: bool = True):
        """``keyframes=False``: read the log from its start even where keyframes are (to compare)."""
        self.path = path
        # a run directory's own log: its folder is the run (for the bundle); a loose file has none
        self.run = path.parent if (path.parent / "config.yaml").exists() else None
        self.lock = threading.Lock()
        self.size = path.stat().st_size  # what is read: a log still growing is replayed as it was when opened
        self.skipped: list[tuple[int, str]] = []  # (line number, why) of each line that is no event
        self._skipped_lines: set[int] = set()
        self.passed_over: list[str] = []  # keyframes not used, and why
        self.frames = self._usable_frames() if keyframes else []
        self.heartbeat_s, self._every = _periods(path)
        self.playing = True
        self.speed = 1.0
        self._rebase(None)
        if not self.frames:
            self._decode_until(math.inf)  # read whole: every line that is no event is known at once
        self._ensure_next()
        self.clock = self.events[0].ts if self.events else 0.0

    # --- where the state is built from ---------------------------------------------------------

    def _usable_frames(self) -> list[tuple[kf.Header, Path]]:
        out = []
        for p in kf.frames(self.path.parent / "keyframes"):
            try:
                h = kf.read_header(p)
                why = kf.mismatch(h, self.path, self.size)
            except kf.KeyframeError as e:
                why = str(e)
            if why:
                self.passed_over.append(f"{p.name}: {why}")
            else:
                out.append((h, p))
        return sorted(out, key=lambda f: f[0].offset)

    def _rebase(self, frame: tuple[kf.Header, Path] | None) -> None:
        """Start over from ``frame`` (None: the log's start): its state, and the log after it."""
        if frame is None:
            self.state, self._pos, self._line, self._before, self._max_ts = RunState(), 0, 0, 0, -math.inf
        else:
            h, p = frame
            self.state = kf.load(p)
            self._pos, self._line, self._before, self._max_ts = h.offset, h.lines, h.lines, h.max_ts
        self.base = frame
        self.events: list = []
        self._line_of = array("q")  # each event's line number
        self.cursor = 0  # events[:cursor] are applied
        self._beats: list = []  # heap of (ts, n, heartbeat to copy, fill until)
        self._n = itertools.count()
        self._fill_at: dict[int, list[tuple[ev.HeartbeatEvent, float]]] = {}  # event index -> gaps after it
        self._last: dict[str, tuple[int, ev.HeartbeatEvent]] = {}  # each worker's latest heartbeat so far
        if frame is not None:  # its workers' latest heartbeats, for the gaps to their next in the log
            st = self.state
            for w in st.workers.values():
                if w.last_heartbeat and w.last_heartbeat >= st.running_since:
                    self._last[w.src] = (-1, ev.HeartbeatEvent(src=w.src, ts=w.last_heartbeat, rss=w.rss, cpu=w.cpu,
                                                               dropped=w.dropped))

    def _frame_for(self, ts: float) -> tuple[kf.Header, Path] | None:
        """The newest keyframe a replay to ``ts`` may start from: every line before it is due by then."""
        return next((f for f in reversed(self.frames) if f[0].max_ts <= ts), None)

    def _goto(self, ts: float) -> None:
        """The state at ``ts``: on from here, or from the newest keyframe before it when that is
        nearer (or when ``ts`` is behind us)."""
        while True:
            frame = self._frame_for(ts)
            here = self._line_of[self.cursor - 1] if self.cursor else self._before
            if ts >= self.clock and (frame is None or frame[0].lines <= here):
                break  # on from here
            try:
                self._rebase(frame)
                break
            except kf.KeyframeError as e:  # the state is still the one before: choose again without it
                self.passed_over.append(str(e))
                self.frames.remove(frame)
        self.clock = ts
        self._apply_until(ts)

    # --- reading the log ------------------------------------------------------------------------

    def _decode_chunk(self) -> bool:
        """Decode the next few MB of the log; False at its end."""
        if self._pos >= self.size:
            return False
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read(min(CHUNK, self.size - self._pos))
            while self._pos + len(data) < self.size and b"\n" not in data:  # a line longer than a chunk
                data += f.read(min(CHUNK, self.size - self._pos - len(data)))
        if self._pos + len(data) < self.size:
            data = data[:data.rfind(b"\n") + 1]
        self._pos += len(data)
        # split at newlines only, as the writer does (splitlines would split at a stray \r too, and
        # the numbers would not be the ones an editor shows)
        lines = data.split(b"\n")
        if not lines[-1]:
            lines.pop()  # after the last newline: nothing
        events, line_of, seen = self.events, self._line_of, self._seen
        for n, line in enumerate(lines, self._line + 1):
            if not line.strip():
                continue
            try:
                e = ev.decode(line)
            except ev.Rejected as r:
                if n not in self._skipped_lines:  # read again after a jump: said once, in line order
                    self._skipped_lines.add(n)
                    bisect.insort(self.skipped, (n, str(r)))  # a torn last line of a crashed run, say: skip
                continue
            events.append(e)
            line_of.append(n)
            if e.ts > self._max_ts:
                self._max_ts = e.ts
            seen(len(events) - 1, e)
        self._line += len(lines)
        return True

    def _decode_until(self, ts: float) -> None:
        """Decode until the lines read reach ``ts`` and the gaps to fill by then are known (a gap
        ends at its worker's next logged heartbeat, at most ``_longest`` later)."""
        while self._max_ts <= ts + self._longest and self._decode_chunk():
            pass

    def _ensure_next(self) -> bool:
        """Is there an event after the cursor (decoding more when needed)?"""
        while self.cursor >= len(self.events):
            if not self._decode_chunk():
                return False
        return True

    def _seen(self, i: int, e) -> None:
        if not self._every:
            return
        if type(e) is ev.HeartbeatEvent:
            self._beat(i, e)
        elif type(e) is ev.HeartbeatsEvent:
            for b in e.beats:
                self._beat(i, ev.heartbeat_of(b))
        elif type(e) is ev.RunEvent and e.state in ("starting", "running", "restarting"):
            self._last.clear()  # a new driver's workers: no gap to fill across it

    def _beat(self, i: int, e: ev.HeartbeatEvent) -> None:
        """A gap the log left out of this worker's heartbeats ends at ``e``: copies of the one before
        to put back, from the time that one is applied (at once when it already is)."""
        before = self._last.get(e.src)
        if before is not None and 1.5 * self.heartbeat_s < e.ts - before[1].ts <= self._longest:
            if before[0] < self.cursor:
                heapq.heappush(self._beats, (before[1].ts + self.heartbeat_s, next(self._n), before[1], e.ts))
            else:
                self._fill_at.setdefault(before[0], []).append((before[1], e.ts))
        self._last[e.src] = (i, e)

    @property
    def _longest(self) -> float:
        # a gap longer than this was a silence
        return self._every + (SILENT_BEATS + 1) * self.heartbeat_s if self._every else 0.0

    # --- the Source ----------------------------------------------------------------------------

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
        if self._pos >= self.size:
            where = f"{self._before + self.cursor}/{self._before + len(self.events)}"
        else:  # the rest of the log is not read yet
            where = f"{self._before + self.cursor} · {100 * self._pos / self.size:.0f} % read"
        return f"replay {mark} {self.speed:g}x · {where}{bad}"

    def warning(self) -> str:
        """One line on the lines that are no events and the keyframes not used ("" when none)."""
        notes = []
        note = skipped_note(self.path, self.skipped)
        if note:
            read = f" {self._before + len(self.events)}" if self._pos >= self.size else ""
            notes.append(f"{note}; replaying the other{read} events")
        if self.passed_over:
            more = f" (and {len(self.passed_over) - 1} more)" if len(self.passed_over) > 1 else ""
            notes.append(f"keyframe not used: {self.passed_over[0][:200]}{more}; the log is read from further back")
        return "; ".join(notes)

    def _apply_until(self, ts: float) -> None:
        self._decode_until(ts)
        events, beats, hb = self.events, self._beats, self.heartbeat_s
        while True:
            more = self.cursor < len(events) or self._ensure_next()
            due = events[self.cursor].ts if more else math.inf
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
            if not more or due > ts:
                return
            e = events[self.cursor]
            self.state.apply(e)
            for beat, until in self._fill_at.pop(self.cursor, ()):
                heapq.heappush(beats, (beat.ts + hb, next(self._n), beat, until))
            self.cursor += 1

    def _at_end(self) -> bool:
        return self.cursor >= len(self.events) and self._pos >= self.size

    def tick(self, wall_dt: float) -> None:
        if not self.playing:
            return
        with self.lock:
            self.clock += wall_dt * self.speed
            self._apply_until(self.clock)
            if self._at_end():
                self.playing = False

    def step(self) -> None:
        with self.lock:
            if self._ensure_next():
                self.clock = max(self.clock, self.events[self.cursor].ts)
                self._apply_until(self.clock)

    def to_end(self) -> None:
        with self.lock:
            clock = self.clock
            self._goto(math.inf)  # from the newest keyframe, if any is ahead
            self.clock = max(clock, self._max_ts)
            self.playing = False

    def to_start(self) -> None:
        with self.lock:
            self._rebase(None)
            self._ensure_next()
            self.clock = self.events[0].ts if self.events else 0.0

    def seek(self, ts: float) -> None:
        """The state as it was at ``ts`` (paused there)."""
        with self.lock:
            self._goto(ts)
        self.playing = False

    def faster(self, up: bool) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else 2
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + (1 if up else -1)))]

    def toggle(self) -> None:
        if self._at_end():
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


def _periods(path: Path) -> tuple[float, float]:
    """(the heartbeat period, the log's period for a quiet worker's) of the first ``run`` event that
    has both, among the log's first lines (a supervisor's log begins with it); (1.0, 0.0) when there
    is none, or they are periods no run has (a hand-made or damaged log): nothing is filled."""
    with open(path, "rb") as f:
        head = f.read(CHUNK)
    for line in head.split(b"\n")[:PERIODS_IN]:
        try:
            e = ev.decode(line)
        except ev.Rejected:
            continue
        if type(e) is ev.RunEvent and e.heartbeat_s and e.heartbeat_log_s:
            hb, every = e.heartbeat_s, e.heartbeat_log_s
            return (hb, every) if hb > 0 and 0 < every <= MAX_FILL * hb else (1.0, 0.0)
    return 1.0, 0.0
