"""``RUN/events.jsonl``: append-only, one event per line, in ``seq`` order.

Lines are written through a buffer that is flushed to the OS at least every 100 ms (every
50 ms under load), and fsynced at most once a second. So a killed supervisor loses at most the
last 100 ms of events; a crash of the machine, at most the last second or so.
"""

from __future__ import annotations

import os
import time
from pathlib import Path


class EventLog:
    def __init__(self, path: Path, fsync_every_s: float = 1.0):
        self.path = path
        self._f = open(path, "ab", buffering=1 << 16)
        os.chmod(path, 0o600)
        self._dirty = False
        self._fsync_every = fsync_every_s
        self._last_fsync = time.monotonic()
        self.lines = 0

    def append(self, line: bytes) -> None:
        self._f.write(line)
        self._f.write(b"\n")
        self._dirty = True
        self.lines += 1

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
