"""A run's state at any moment of its log: from the newest keyframe before that moment, the log's
lines after it decoded a few MB at a time, and the heartbeats the log left out put back.

The log leaves out the heartbeats of a quiet worker between two it keeps (``heartbeats``); a
timeline puts them back, copies of the one before at the run's heartbeat period, so a heartbeat's
age reads as it did live. A worker that fell silent has no later heartbeat in the log to fill up
to, and ages as it did.

A long recording is not read whole. The state starts from the newest keyframe of the state at or
before the moment it is asked for (``keyframes``: the supervisor writes one each time the log has
grown by 32 MB) and the log after it is decoded as the moment moves on: the end of a 10-minute
recording of 65,536 workers is a keyframe and the lines after it. A log without keyframes (a short
run, a file on its own) is read whole when opened.

The dashboard's replay (``gkd_tui.sources.replay``) is a timeline that plays.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from array import array
from pathlib import Path

import msgspec

from gkd_core.runlog import keyframes as kf
from gkd_core.runlog import reader
from gkd_core.runlog.heartbeats import SILENT_BEATS
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.vocab import RUN_GOING

# what a gap is filled with: a worker's beat (alone, or of its relay's batch), a relay's clock
Filled = ev.HeartbeatEvent | ev.Beat | ev.HeartbeatsEvent
CLOCK = "\0clock "  # a relay's clock among the workers' heartbeats that gaps are filled for (no src has a NUL)


def _clock(relay: str, epoch: float, ts: float) -> ev.HeartbeatsEvent:
    """A relay's clock alone, at ``ts``: what a gap in the log's clocks of it is filled with."""
    return ev.HeartbeatsEvent(src="supervisor", ts=ts, clocks=[ev.RelayClock(relay, epoch, ts)])


def _same_epoch(e: Filled, before: Filled) -> bool:
    """Is ``e`` of the same relay's run as ``before`` (a worker's beats always are)?"""
    if type(e) is ev.HeartbeatsEvent and type(before) is ev.HeartbeatsEvent:
        return e.clocks[0].epoch == before.clocks[0].epoch
    return True


def _copy_at(e: Filled, t: float) -> ev.Event:
    """A heartbeat the log left out, put back at ``t``: the one before it said again (its time in its phase
    grown with it), or a relay's clock at ``t``."""
    if type(e) is ev.HeartbeatsEvent:
        return _clock(e.clocks[0].relay, e.clocks[0].epoch, t)
    if type(e) is ev.Beat:  # (a batch's)
        e = wire.heartbeat_of(e)
    assert type(e) is ev.HeartbeatEvent
    return msgspec.structs.replace(e, ts=t, seq=0, elapsed=e.elapsed + (t - e.ts))


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
        self._beats: list = []  # heap of (ts, n, heartbeat to copy, fill until)
        self._n = itertools.count()
        self._fill_at: dict[int, list[tuple[Filled, float]]] = {}  # event index -> gaps after it
        # a relay's clock seen: its workers' gaps are the clock's to fill, their full beats stay as live
        self._clocked = bool(frame is not None and self.state.relay_clocks)
        # each worker's latest heartbeat so far, and each relay's clock (CLOCK + the relay)
        self._last: dict[str, tuple[int, Filled]] = {}
        if frame is not None:  # its workers' latest heartbeats, for the gaps to their next in the log
            st = self.state
            for w in st.workers.values():
                if w.last_heartbeat and w.last_heartbeat >= st.running_since:
                    self._last[w.src] = (-1, ev.HeartbeatEvent(src=w.src, ts=w.last_heartbeat, rss=w.rss, cpu=w.cpu,
                                                               dropped=w.dropped))
            for relay, (epoch, ts) in st.relay_clocks.items():
                if ts >= st.running_since:
                    self._last[CLOCK + relay] = (-1, _clock(relay, epoch, ts))

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
        events, line_of, seen = self.events, self._line_of, self._seen
        for n, e in reader.decode_lines(lines, self._line + 1, self._bad):
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

    def has_next(self) -> bool:
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
            if e.clocks:
                self._clocked = True
            if not self._clocked:  # (a log from before relays' clocks: their workers' quiet beats were logged)
                for b in e.beats:
                    self._beat(i, wire.heartbeat_of(b))
            else:  # a vouched-for worker's full beat: its clock fills the gap before it, and one the log
                last = self._last  # restates later (fallen silent) is filled from this one's numbers, not
                for b in e.beats:  # an older beat's, whose copies would undo a change in between
                    last[b.src] = (i, b)
            for c in e.clocks:  # (a clock that says a worker quiet was held back by it since that one's time)
                until = min(c.ts, min(ts for _, ts in c.quiet)) if c.quiet else c.ts
                self._beat(i, _clock(c.relay, c.epoch, c.ts), CLOCK + c.relay, until)
        elif type(e) is ev.RunEvent and e.state in RUN_GOING:
            self._last.clear()  # a new driver's workers: no gap to fill across it

    def _beat(self, i: int, e: Filled, key: str = "", until: float | None = None) -> None:
        """A gap the log left out of this worker's heartbeats (or of a relay's clock, ``key``) ends at ``e``:
        copies of the one before to put back, from the time that one is applied (at once when it already
        is), up to ``until`` (``e``'s time unless said). A relay started again is not filled across."""
        key = key or e.src
        before = self._last.get(key)
        if (before is not None and 1.5 * self.heartbeat_s < e.ts - before[1].ts <= self._longest
                and _same_epoch(e, before[1])):
            end = e.ts if until is None else until
            if end <= before[1].ts + self.heartbeat_s:
                pass  # (nothing to put back before it)
            elif before[0] < self.cursor:
                heapq.heappush(self._beats, (before[1].ts + self.heartbeat_s, next(self._n), before[1], end))
            else:
                self._fill_at.setdefault(before[0], []).append((before[1], end))
        self._last[key] = (i, e)

    @property
    def _longest(self) -> float:
        # a gap longer than this was a silence
        return self._every + (SILENT_BEATS + 1) * self.heartbeat_s if self._every else 0.0

    # --- applying it ---------------------------------------------------------------------------

    def apply_until(self, ts: float) -> None:
        self._decode_until(ts)
        events, beats, hb = self.events, self._beats, self.heartbeat_s
        while True:
            more = self.cursor < len(events) or self.has_next()
            due = events[self.cursor].ts if more else math.inf
            if beats and beats[0][0] <= ts and beats[0][0] < due:
                t, _, e, until = heapq.heappop(beats)
                # straight to the last copy due by ``ts``: the ones before it are overwritten by it (a copy
                # changes its worker's heartbeat alone, and its next real one comes at ``until``), so a
                # jump to the end of a 65,536-worker recording applies one copy per gap, not one per beat
                last = t + int((min(ts, until) - t) / hb) * hb
                t = max(t, last - hb if last >= until else last)
                self.state.apply(_copy_at(e, t))
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
