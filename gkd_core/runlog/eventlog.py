"""``RUN/events.jsonl``: append-only, one event per line, in ``seq`` order.

Lines are written through a buffer that is flushed to the OS at least every 100 ms (every
50 ms under load), and fsynced at most once a second. So a killed supervisor loses at most the
last 100 ms of events; a crash of the machine, at most the last second or so.

It knows where it stands (the byte, the line, the newest ``ts`` so far, the last line): a keyframe
of the state (``keyframes``) names the place in the log it is the state at.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class EventLog:
    def __init__(self, path: Path, fsync_every_s: float = 1.0, max_ts: float = 0.0):
        """``max_ts``: the newest ``ts`` among the lines already there (a run taken over)."""
        self.path = path
        self._f = open(path, "ab", buffering=1 << 16)
        os.chmod(path, 0o600)
        self._dirty = False
        self._fsync_every = fsync_every_s
        self._last_fsync = time.monotonic()
        self.lines = 0  # appended by this writer
        # where a log taken over (recovered: whole lines) stands, read in pieces: it may be GBs
        self.offset, self.line_no, self.last_line = _where(path) if self._f.tell() else (0, 0, b"")
        self.max_ts = max_ts

    def append(self, line: bytes, ts: float) -> None:
        self._f.write(line)
        self._f.write(b"\n")
        self._dirty = True
        self.lines += 1
        self.line_no += 1
        self.offset += len(line) + 1
        self.last_line = line
        if ts > self.max_ts:
            self.max_ts = ts

    def flush(self) -> None:
        if not self._dirty:
            return
        self._f.flush()
        self._dirty = False
        now = time.monotonic()
        if now - self._last_fsync >= self._fsync_every:
            os.fsync(self._f.fileno())
            self._last_fsync = now

    def close(self) -> None:
        self._dirty = True
        self._last_fsync = 0.0
        self.flush()
        self._f.close()


def _where(path: Path) -> tuple[int, int, bytes]:
    """(bytes, lines, the last line without its newline) of a log that ends with a newline."""
    size = lines = 0
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            size += len(chunk)
            lines += chunk.count(b"\n")
            tail = (tail + chunk)[-(4 << 20):]  # a line is at most 1 MiB (the heartbeats lines less)
    return size, lines, tail[tail.rfind(b"\n", 0, len(tail) - 1) + 1:-1]


def recover(path: Path) -> list[bytes]:
    """The lines of the log of a run whose supervisor is gone, for the one that takes it over.

    A supervisor killed while writing may leave a torn last line: it is cut off (and kept in
    ``events.jsonl.torn``) so that the log stays one JSON object per line and the new lines start
    on a line of their own."""
    data = path.read_bytes() if path.exists() else b""
    cut = data.rfind(b"\n") + 1
    if cut < len(data):
        with open(path.with_name(path.name + ".torn"), "ab") as f:
            f.write(data[cut:] + b"\n")
        os.truncate(path, cut)
    return [line for line in data[:cut].split(b"\n") if line.strip()]
