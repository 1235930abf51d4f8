"""Every worker: role, node, pid, GPU, phase, time in phase, step, heartbeat age.

Updated by diff (add new rows, remove gone ones, update only the cells that changed), so a
large run does not redraw the whole table every tick. Stale heartbeats are red, terminal
phases dim, a phase near its deadline yellow.
"""

from __future__ import annotations

from rich.text import Text
from textual.widgets import DataTable

from gkd_core.state import TERMINAL_PHASES, RunState, WorkerState
from gkd_tui.widgets.format import fmt_duration

# most telling first: on a narrow terminal the last columns are the ones cut off
COLUMNS = ("worker", "phase", "in phase", "heartbeat", "step", "pid", "node", "gpu")
WIDTHS = (13, 12, 8, 10, 4, 7, 8, 3)


class WorkersTable(DataTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for name, width in zip(COLUMNS, WIDTHS):
            self.add_column(name, key=name, width=width)
        self._cells: dict[str, tuple] = {}

    def row_style(self, st: RunState, w: WorkerState, now: float, stall_s: float) -> str:
        age = st.heartbeat_age(w, now)
        if w.phase in TERMINAL_PHASES:
            return "red" if w.phase == "failed" else "dim"
        if age is not None and age > stall_s:
            return "bold red"
        if w.deadline and now > w.deadline - 0.2 * max(1.0, w.deadline - w.phase_since):
            return "yellow"
        return ""

    def show(self, st: RunState, now: float, stall_s: float = 10.0, filter_text: str = "") -> None:
        rows = {}
        for ws in st.workers_by_role().values():
            for w in ws:
                if filter_text and filter_text not in f"{w.src} {w.phase} {w.node}":
                    continue
                style = self.row_style(st, w, now, stall_s)
                age = st.heartbeat_age(w, now)
                stale = age is not None and age > stall_s and w.phase not in TERMINAL_PHASES
                rows[w.src] = tuple(Text(str(v), style=style) for v in (
                    w.src, w.phase or "-", fmt_duration(st.time_in_phase(w, now)),
                    (fmt_duration(age) + (" STALE" if stale else "")) if age is not None else "-",
                    "-" if w.step is None else w.step, w.pid or "-", w.node or "-",
                    ",".join(map(str, w.gpus)) or "-",
                ))
        for key in [k for k in self._cells if k not in rows]:
            self.remove_row(key)
            del self._cells[key]
        for key, cells in rows.items():
            old = self._cells.get(key)
            if old is None:
                self.add_row(*cells, key=key)
            else:
                for col, (a, b) in zip(COLUMNS, zip(old, cells)):
                    if a.plain != b.plain or a.style != b.style:
                        self.update_cell(key, col, b)
            self._cells[key] = cells
