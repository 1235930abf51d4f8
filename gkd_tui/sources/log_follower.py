"""Follow the run's log files (RUN/logs) with watchfiles: the last lines, without re-reading."""

from __future__ import annotations

import collections
import re
import threading
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class LogFollower:
    """Keeps the last ``keep`` lines of every file under ``folder``; a thread wakes on changes."""

    def __init__(self, folder: Path, keep: int = 200):
        self.folder = folder
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._offsets: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gkd-log-follower", daemon=True)

    def start(self) -> None:
        self._read_new()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)

    def _read_new(self) -> None:
        for path in sorted(self.folder.glob("*.log")):
            try:
                size = path.stat().st_size
                start = self._offsets.get(path, max(0, size - 32_768))  # a long log: its tail only
                if size < start:  # truncated or replaced: start over
                    start = 0
                if size == start:
                    continue
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read(size - start)
            except OSError:
                continue
            # keep a partial last line for the next read
            cut = data.rfind(b"\n") + 1
            self._offsets[path] = start + cut
            for line in _ANSI.sub("", data[:cut].decode(errors="replace")).splitlines():
                if line.strip():
                    self.lines.append(f"{path.stem}: {line}"[:400])

    def _run(self) -> None:
        from watchfiles import watch

        try:
            for _changes in watch(self.folder, stop_event=self._stop, debounce=200, rust_timeout=1000,
                                  yield_on_timeout=True):
                self._read_new()
        except FileNotFoundError:  # a vanished folder (the run was deleted): stop following, said in the pane
            self.lines.append("(the run's log folder is gone: no more lines from it)")
        except Exception as e:  # a bug of ours or of watchfiles: the pane says its log stopped, and why
            self.lines.append(f"(the log pane stopped following RUN/logs: {type(e).__name__}: {e})"[:400])
