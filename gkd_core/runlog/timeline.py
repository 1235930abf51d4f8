"""A run's state at any moment of its log: from the newest keyframe before that moment, the log's
lines after it decoded a few MB at a time, and the heartbeats the log left out put back.

The log leaves out the heartbeats of a quiet worker between two it keeps; a timeline puts them back
(``runlog.heartbeats.Gaps``: the log's beat policy, both ways, is there).

A long recording is not read whole. The state starts from the newest keyframe of the state at or
before the moment it is asked for (``keyframes``: the supervisor writes one each time the log has
grown by 32 MB) and the log after it is decoded as the moment moves on: the end of a 10-minute
recording of 65,536 workers is a keyframe and the lines after it. A log without keyframes (a short
run, a file on its own) is read whole when opened.

The dashboard's replay (``gkd_tui.sources.replay``) is a timeline that plays.
"""

from __future__ import annotations

import bisect
import math
from array import array
from pathlib import Path

from gkd_core.runlog import keyframes as kf
from gkd_core.runlog import reader
from gkd_core.runlog.heartbeats import Gaps
from gkd_core.state import RunState


class Timeline:
    """``state`` as of ``clock``; ``events[:cursor]`` are applied (after the keyframe ``base``)."""

    def __init__(self, path: Path, keyframes: bool = True):
        """``keyframes=False``: read the log from its start even where keyframes are (to compare)."""
        self.path = path
        self.size = path.stat().st_size  # what is read: a log still growing is replayed as it was when opened
        self.skipped: list[tuple[int, str]] = []  # (line number, why) of each line that is no event
        self._skipped_lines: set[int] = set()
        self.passed_over: list[str] = []  # keyframes not used, and why
        self.frames = self._usable_frames() if keyframes else []
        self.heartbeat_s, self._every = reader.periods(path)
        self.rebase(None)
        if not self.frames:
            self._decode_until(math.inf)  # read whole: every line that is no event is known at once
        self.has_next()
        self.clock = self.events[0].ts if self.events else 0.0  # the moment the state is of

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

    def rebase(self, frame: tuple[kf.Header, Path] | None) -> None:
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
        self.gaps = Gaps(self.heartbeat_s, self._every, self.state if frame is not None else None)

    def _frame_for(self, ts: float) -> tuple[kf.Header, Path] | None:
        """The newest keyframe a replay to ``ts`` may start from: every line before it is due by then."""
        return next((f for f in reversed(self.frames) if f[0].max_ts <= ts), None)

    def goto(self, ts: float) -> None:
        """The state at ``ts``: on from here, or from the newest keyframe before it when that is
        nearer (or when ``ts`` is behind us)."""
        while True:
            frame = self._frame_for(ts)
            here = self._line_of[self.cursor - 1] if self.cursor else self._before
            if ts >= self.clock and (frame is None or frame[0].lines <= here):
                break  # on from here
            try:
                self.rebase(frame)
                break
            except kf.KeyframeError as e:  # the state is still the one before: choose again without it
                assert frame is not None  # (only a keyframe's read fails)
                self.passed_over.append(str(e))
                self.frames.remove(frame)
        self.clock = ts
        self.apply_until(ts)

    # --- reading the log ------------------------------------------------------------------------

    def _decode_chunk(self) -> bool:
        """Decode the next few MB of the log; False at its end."""
        if self._pos >= self.size:
            return False
        data = reader.read_chunk(self.path, self._pos, self.size)
        self._pos += len(data)
        lines = reader.split_lines(data)
        events, line_of, seen = self.events, self._line_of, self.gaps.seen
        for n, e in reader.decode_lines(lines, self._line + 1, self._bad):
            events.append(e)
            line_of.append(n)
            if e.ts > self._max_ts:
                self._max_ts = e.ts
            seen(len(events) - 1, e, self.cursor)
        self._line += len(lines)
        return True

    def _decode_until(self, ts: float) -> None:
        """Decode until the lines read reach ``ts`` and the gaps to fill by then are known (a gap
        ends at its worker's next logged heartbeat, at most ``Gaps.longest`` later)."""
        while self._max_ts <= ts + self.gaps.longest and self._decode_chunk():
            pass

    def has_next(self) -> bool:
        """Is there an event after the cursor (decoding more when needed)?"""
        while self.cursor >= len(self.events):
            if not self._decode_chunk():
                return False
        return True

    # --- applying it ---------------------------------------------------------------------------

    def apply_until(self, ts: float) -> None:
        """Every line due by ``ts`` applied, and between them the heartbeats the log left out (``gaps``)."""
        self._decode_until(ts)
        events, gaps = self.events, self.gaps
        while True:
            more = self.cursor < len(events) or self.has_next()
            due = events[self.cursor].ts if more else math.inf
            copy_at = gaps.next_due()
            if copy_at is not None and copy_at <= ts and copy_at < due:
                self.state.apply(gaps.copy_due(ts))
                continue
            if not more or due > ts:
                return
            self.state.apply(events[self.cursor])
            gaps.applied(self.cursor)
            self.cursor += 1

    def at_end(self) -> bool:
        return self.cursor >= len(self.events) and self._pos >= self.size

    def _bad(self, n: int, why: str) -> None:
        if n not in self._skipped_lines:  # read again after a jump: said once, in line order
            self._skipped_lines.add(n)
            bisect.insort(self.skipped, (n, why))

    @property
    def read_whole(self) -> bool:
        return self._pos >= self.size

    @property
    def fraction_read(self) -> float:
        return self._pos / self.size if self.size else 1.0

    @property
    def newest_ts(self) -> float:
        """The newest ``ts`` among the lines read so far (and the keyframe's)."""
        return self._max_ts

    @property
    def lines_before(self) -> int:
        """Lines of the log before ``events[0]`` (the keyframe's state holds what they said)."""
        return self._before
