"""The last log lines the run reported (warnings and errors first to catch the eye)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from gkd_core.state import RunState

LEVEL_STYLE = {"error": "bold red", "warn": "yellow", "warning": "yellow"}


class LogTail(Static):
    def show(self, st: RunState, now: float, lines: int = 8) -> None:
        t = Text()
        tail = st.logs[-lines:]
        if not tail and st.log_tail:
            tail = [f"driver: {line}" for line in st.log_tail[-lines:]]
        if not tail:
            t.append("no log lines yet", style="dim")
        for line in tail:
            level = line.split(" ", 2)[1].rstrip(":") if " " in line else ""
            t.append(line[:300] + "\n", style=LEVEL_STYLE.get(level, ""))
        self.update(t)
