"""Every worker: phase, time in phase, heartbeat age, step, GPU, pid, node, and its Ray actor's state.

A line-API table that renders only the rows on screen, straight from the RunState: with 4,096
workers a redraw costs the same as with 40, and nothing is copied into the widget (a DataTable
would hold a second copy of every cell and re-render it on each heartbeat). Stale heartbeats
are red, terminal phases dim, a phase near its deadline yellow.
"""

from __future__ import annotations

import time
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gkd_core.state import TERMINAL_PHASES, RunState, WorkerState
from gkd_tui.widgets.format import NO_COLOR, fmt_duration, monochrome
from gkd_tui.widgets.styles import NAMED_ROW_STYLE, named_workers

# most telling first: on a narrow terminal the last columns are the ones cut off
COLUMNS = ("worker", "phase", "in phase", "heartbeat", "step", "gpu", "pid", "node", "ray")
WIDTHS = (13, 12, 8, 10, 5, 3, 7, 12, 10)
# the name and phase columns grow to fit (RolloutWorker/12, sync_rollout_weights), up to this
GROW_TO = {0: 22, 1: 22}
# the row order (role, rank) changes only when workers join; re-sorting 4,096 rows costs a few
# milliseconds, so it is done when the count changes and otherwise at most this often
RESORT_S = 1.0


def cells_line(cells, widths=WIDTHS) -> list[str]:
    """The row's text a cell at a time (one segment each: a terminal does not care, but an SVG
    capture lays out each segment on its own, so a bold row cannot drift past the last column)."""
    return [" "] + [str(c)[:w].ljust(w + 1) for c, w in zip(cells, widths)]


@lru_cache(maxsize=64)
def parsed(style: str) -> Style:
    if NO_COLOR:
        style = monochrome(style)
    return Style.parse(style) if style else Style()


def sort_key(w: WorkerState):
    return (w.role, w.rank if w.rank is not None else -1, w.src)


class WorkersTable(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"workers-table--header", "workers-table--cursor", "workers-table--odd"}
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("enter", "select", "Worker details"),
    ]
    cursor = reactive(0)

    class Selected(Message):
        """Enter (or a click) on a row: the worker's details."""

        def __init__(self, src: str) -> None:
            super().__init__()
            self.src = src

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.order: list[str] = []  # the srcs shown, in order (filtered)
        self._state: RunState | None = None
        self._now = 0.0
        self._stall_s = 10.0
        self._named: dict[str, str] = {}  # worker -> the severity of the worst alert naming it
        self._filter = ""
        self._sorted_for: tuple = ()
        self._sorted_at = 0.0
        self._base: Style | None = None  # the widget's own style, looked up once per redraw
        self.widths = WIDTHS
        self._header = cells_line(COLUMNS)

    # --- data ----------------------------------------------------------------------------

    def show(self, st: RunState, now: float, stall_s: float = 10.0, filter_text: str = "") -> None:
        """Point the table at ``st``; only the visible rows are rendered, at the next refresh."""
        selected = self.selected
        self._state, self._now, self._stall_s = st, now, stall_s
        self._named = named_workers(st)
        self._base = None
        signature = (id(st), len(st.workers), filter_text)
        mono = time.monotonic()
        if signature != self._sorted_for or filter_text or mono - self._sorted_at > RESORT_S:
            ws = sorted(st.workers.values(), key=sort_key)
            if filter_text:  # phases change, so a filtered list is rebuilt on every show
                ws = [w for w in ws if filter_text in f"{w.src} {w.phase} {w.node}"]
            self.order = [w.src for w in ws]
            self._sorted_for, self._sorted_at = signature, mono
            if selected in self.order:
                self.cursor = self.order.index(selected)  # the cursor follows its worker
            self._fit(ws)
            self.virtual_size = Size(sum(self.widths) + len(self.widths) + 1, len(self.order) + 1)
        self.cursor = min(self.cursor, max(0, len(self.order) - 1))
        self.refresh()

    def _fit(self, ws: list[WorkerState]) -> None:
        widths = list(WIDTHS)
        if ws:
            widths[0] = max(WIDTHS[0], min(GROW_TO[0], max(len(w.src) for w in ws)))
            widths[1] = max(WIDTHS[1], min(GROW_TO[1], max(len(w.phase) for w in ws)))
        if tuple(widths) != self.widths:
            self.widths = tuple(widths)
            self._header = cells_line(COLUMNS, self.widths)

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def selected(self) -> str | None:
        return self.order[self.cursor] if 0 <= self.cursor < len(self.order) else None

    def row_style(self, w: WorkerState) -> str:
        st, now = self._state, self._now
        age = st.heartbeat_age(w, now)
        if w.phase in TERMINAL_PHASES:
            return "red" if w.phase == "failed" else "dim"
        if w.ray_state == "DEAD":  # Ray says so, whatever its last heartbeat said
            return "bold red"
        named = self._named.get(w.src)
        if named in NAMED_ROW_STYLE:  # a straggler, a frozen or an out-of-memory worker: the eye goes there
            return NAMED_ROW_STYLE[named]
        if age is not None and age > self._stall_s:
            return "bold red"
        if w.deadline and now > w.deadline - 0.2 * max(1.0, w.deadline - w.phase_since):
            return "yellow"
        return ""

    def row_cells(self, w: WorkerState) -> tuple:
        st, now = self._state, self._now
        age = st.heartbeat_age(w, now)
        stale = age is not None and age > self._stall_s and w.phase not in TERMINAL_PHASES
        return (w.src, w.phase or "-", fmt_duration(st.time_in_phase(w, now)),
                (fmt_duration(age) + (" STALE" if stale else "")) if age is not None else "-",
                "-" if w.step is None else w.step, ",".join(map(str, w.gpus)) or "-", w.pid or "-", w.node or "-",
                w.ray_state.lower() or "-")

    # --- rendering: the header, then the rows under the scroll offset -----------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if self._base is None:
            self._base = self.rich_style
        base = self._base
        if y == 0:
            style = base + self.get_component_rich_style("workers-table--header")
            text = self._header
        else:
            index = scroll_y + y - 1
            w = self._state.workers.get(self.order[index]) if (self._state and index < len(self.order)) else None
            if w is None:
                return Strip.blank(width, base)
            style = base
            if index % 2:
                style += self.get_component_rich_style("workers-table--odd")
            if index == self.cursor:
                style += self.get_component_rich_style("workers-table--cursor")
            style += parsed(self.row_style(w))
            text = cells_line(self.row_cells(w), self.widths)
        # padded to the pane's width, so the stripes and the cursor span the whole row
        pad = scroll_x + width - sum(map(len, text))
        segments = [Segment(cell, style) for cell in text] + ([Segment(" " * pad, style)] if pad > 0 else [])
        return Strip(segments).crop(scroll_x, scroll_x + width)

    # --- the cursor --------------------------------------------------------------------------

    def watch_cursor(self, cursor: int) -> None:
        body = max(1, self.scrollable_content_region.height - 1)  # rows under the header
        if cursor < self.scroll_y:
            self.scroll_to(y=cursor, animate=False, immediate=True)
        elif cursor >= self.scroll_y + body:
            self.scroll_to(y=cursor - body + 1, animate=False, immediate=True)
        self.refresh()

    def action_move(self, delta: int) -> None:
        if self.order:
            self.cursor = max(0, min(len(self.order) - 1, self.cursor + delta))

    def action_page(self, direction: int) -> None:
        self.action_move(direction * max(1, self.scrollable_content_region.height - 2))

    def action_select(self) -> None:
        if self.selected:
            self.post_message(self.Selected(self.selected))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        index = int(self.scroll_y) + offset.y - 1
        if 0 <= index < len(self.order):
            self.cursor = index
            if event.chain == 2:
                self.action_select()
