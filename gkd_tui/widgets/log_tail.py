"""The last log lines the run reported (warnings and errors first to catch the eye)."""

from __future__ import annotations

from rich.text import Text

from gkd_core.state import RunState
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import LEVEL


class LogTail(Pane):
    def show(self, st: RunState, now: float, files: list[str] | None = None) -> None:
        """The run's own log events (warnings and errors styled), then the tail of RUN/logs."""
        lines = max(3, self.size.height - 2)
        t = Text()
        events = [(line.said(), line.level) for line in st.logs[-(lines // 2 if files else lines):]]
        if not events and st.log_tail:
            events = [(f"driver: {line}", "") for line in st.log_tail[-lines:]]
        for said, level in events:
            t.append(said[:300] + "\n", style=self.tone(LEVEL.get(level)))
        for line in (files or [])[-(lines - len(events)):] if lines > len(events) else []:
            t.append(line[:300] + "\n", style="dim")
        if not t.plain:
            t.append("no log lines yet", style="dim")
        self.put(t)
