"""Every worker: phase, time in phase, heartbeat age, step, GPU, pid, node, and its Ray actor's state.

Grouped by role, what is wrong first (``worker_groups``): at 65,536 workers the first screen holds
the groups' counts and the stragglers, the stale and the dead; enter opens a group (or a worker's
details). A line-API table that renders only the rows on screen, straight from the RunState: with
65,536 workers a redraw costs the same as with 40, and nothing is copied into the widget. Stale
heartbeats are red, terminal phases dim, a phase near its deadline yellow (app.tcss, widgets/styles.py).
"""

from __future__ import annotations

import time

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gkd_core.state import AlertState, RunState, WorkerState
from gkd_core.state.liveness import FROZEN, Limits, judge
from gkd_core.state.views import shown_phase
from gkd_core.vocab import WORKER_ENDED
from gkd_tui.widgets import worker_groups
from gkd_tui.widgets.format import fmt_duration
from gkd_tui.widgets.styles import DONE, ROW_CLASSES

# most telling first: on a narrow terminal the last columns are the ones cut off
COLUMNS = ("worker", "phase", "in phase", "heartbeat", "step", "gpu", "pid", "node", "ray")
WIDTHS = (13, 12, 8, 10, 5, 3, 7, 12, 10)
# the name and phase columns grow to fit (RolloutWorker/12, sync_rollout_weights), up to this
GROW_TO = {0: 22, 1: 22}
# the rows are rebuilt (one pass over the workers: 30 ms at 65,536, 60-150 ms on a busy machine) when workers
# join or leave, a group is opened, or the filter changes, and otherwise at most this often: a straggler moves
# to the top within a second, while the rows on screen are redrawn from the state ten times a second
RESORT_S = 1.0
# a larger run's rows, rebuilt because their time is up, go a slice of this many workers a redraw
# (worker_groups.Pass: 3 ms each alone, about 12 ms on a busy machine); when anything else changed (workers
# joined, a filter, a group opened, a replay's seek) they are built whole, at once
SLICE = 8192
SLICES = 8  # ... and at most this many slices (a larger one's are larger): the rows follow within a second


def cells_line(cells, widths=WIDTHS) -> list[str]:
    """The row's text a cell at a time (one segment each: a terminal does not care, but an SVG
    capture lays out each segment on its own, so a bold row cannot drift past the last column)."""
    return [" "] + [str(c)[:w].ljust(w + 1) for c, w in zip(cells, widths, strict=True)]


sort_key = worker_groups.sort_key


class WorkersTable(ScrollView, can_focus=True):
    COMPONENT_CLASSES = {"workers-table--header", "workers-table--cursor", "workers-table--odd",
                         "workers-table--group", *ROW_CLASSES}
    BINDINGS = [
        Binding("up", "move(-1)", "Up", show=False),
        Binding("down", "move(1)", "Down", show=False),
        Binding("pageup", "page(-1)", "Page up", show=False),
        Binding("pagedown", "page(1)", "Page down", show=False),
        Binding("enter", "select", "Details / open group"),
    ]
    cursor = reactive(0)

    class Selected(Message):
        """Enter (or a click) on a row: the worker's details."""

        def __init__(self, src: str) -> None:
            super().__init__()
            self.src = src

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rows: list[tuple] = []  # ("group", Group) or ("worker", src), in order (worker_groups)
        self.order: list[str] = []  # a key per row: the worker's src, or "group:<role>"
        self._state: RunState | None = None
        self._now = 0.0
        self._limits = Limits()
        self._named: dict[str, AlertState] = {}  # worker -> the most severe alert naming it
        self._toggled: set[str] = set()  # groups opened (or closed) with enter
        self._filter = ""
        self._built_for: tuple = ()
        self._built_at = 0.0
        self._pass: worker_groups.Pass | None = None  # a large run's rows under way, a slice a redraw
        self._pass_for: tuple = ((), 0.0)  # (its signature, when it began)
        self._base: Style | None = None  # the widget's own style, looked up once per redraw
        self.widths: tuple[int, ...] = WIDTHS
        self._header = cells_line(COLUMNS)

    # --- data ----------------------------------------------------------------------------

    def show(self, st: RunState, now: float, stall_s: float = 10.0, filter_text: str = "") -> None:
        """Point the table at ``st``; only the visible rows are rendered, at the next refresh."""
        self._state, self._now, self._filter = st, now, filter_text
        self._limits = Limits(st.heartbeat_s, stall_s)
        self._named = worker_groups.worst_alerts(st)
        self._base = None
        signature = (id(st), len(st.workers), filter_text, frozenset(self._toggled))
        mono = time.monotonic()
        if self._pass is not None and signature != self._pass_for[0]:
            self._pass = None  # what is shown changed under it: the rows are built whole, below
        if self._pass is None and (signature != self._built_for or mono - self._built_at > RESORT_S):
            if len(st.workers) > SLICE and signature == self._built_for:  # only their time is up: in slices
                self._pass = worker_groups.Pass(st, self._limits, self._toggled, filter_text)
                self._pass_for = (signature, mono)
            else:
                self.rebuild()
                self._built_for, self._built_at = signature, mono
        if self._pass is not None:
            self._pass.take(now, max(SLICE, -(-len(st.workers) // SLICES)))
            if self._pass.done:
                self._install(self._pass.rows())
                (self._built_for, self._built_at), self._pass = self._pass_for, None
        self.refresh()

    def resort_soon(self) -> None:
        """Rebuild the rows whole at the next ``show``, not up to RESORT_S later: the state jumped (a replay's
        seek), and the groups' lines must not show a moment the rows under them have left."""
        self._built_for, self._built_at, self._pass = (), 0.0, None

    def rebuild(self) -> None:
        """The rows, whole, now."""
        st = self._state
        assert st is not None  # (shown first)
        self._pass = None
        self._install(worker_groups.build(st, self._now, self._limits, self._toggled, self._filter))

    def _install(self, rows: list[tuple]) -> None:
        selected = self.order[self.cursor] if 0 <= self.cursor < len(self.order) else None
        st = self._state
        assert st is not None  # (shown first)
        self.rows = rows
        self.order = [row[1].key if row[0] == "group" else row[1] for row in self.rows]
        if selected in self.order:
            self.cursor = self.order.index(selected)  # the cursor follows its worker
        self.cursor = min(self.cursor, max(0, len(self.order) - 1))
        self._fit([st.workers[row[1]] for row in self.rows if row[0] == "worker" and row[1] in st.workers])
        self.virtual_size = Size(sum(self.widths) + len(self.widths) + 1, len(self.order) + 1)

    def _fit(self, ws: list[WorkerState]) -> None:
        widths = list(WIDTHS)
        if ws:
            widths[0] = max(WIDTHS[0], min(GROW_TO[0], max(len(w.src) for w in ws)))
            widths[1] = max(WIDTHS[1], min(GROW_TO[1], max(len(shown_phase(w)) for w in ws)))
        if tuple(widths) != self.widths:
            self.widths = tuple(widths)
            self._header = cells_line(COLUMNS, self.widths)

    @property
    def row_count(self) -> int:
        return len(self.order)

    @property
    def workers_shown(self) -> list[str]:
        return [row[1] for row in self.rows if row[0] == "worker"]

    @property
    def selected(self) -> str | None:
        """The worker under the cursor; None on a group's line."""
        if 0 <= self.cursor < len(self.rows) and self.rows[self.cursor][0] == "worker":
            return self.rows[self.cursor][1]
        return None

    def targets(self) -> list[str]:
        """What `d` dumps: the worker under the cursor, or on a group's line its troubled workers."""
        if self.selected is not None:
            return [self.selected]
        if 0 <= self.cursor < len(self.rows):
            return [src for _, src, _ in self.rows[self.cursor][1].trouble]
        return []

    def move_to(self, src: str) -> None:
        """Put the cursor on ``src``'s row, opening its group if it is closed."""
        if src not in self.order and self._state is not None and src in self._state.workers:
            w = self._state.workers[src]
            self._toggled.symmetric_difference_update({f"group:{w.role or w.src}"})
            self.rebuild()
        if src in self.order:
            self.cursor = self.order.index(src)

    def row_style(self, w: WorkerState) -> str | None:
        """The name of its row's style (widgets/styles.py); None for a worker with nothing to say."""
        if w.phase in WORKER_ENDED and w.phase != "failed":
            return DONE
        assert self._state is not None  # (a row of the state shown)
        why = worker_groups.trouble(self._state, w, self._named.get(w.src), self._now, self._limits)
        return why[2] if why is not None else None

    def row_cells(self, w: WorkerState) -> tuple:
        st, now = self._state, self._now
        assert st is not None  # (a row of the state shown)
        age = st.heartbeat_age(w, now)
        stale = age is not None and judge(st, w, now, self._limits).word == FROZEN
        return (w.src, shown_phase(w), fmt_duration(st.time_in_phase(w, now)),
                (fmt_duration(age) + (" STALE" if stale else "")) if age is not None else "-",
                "-" if w.step is None else w.step, ",".join(map(str, w.gpus)) or "-", w.pid or "-", w.node or "-",
                w.ray_state.lower() or "-")

    def group_line(self, g: worker_groups.Group) -> list[str]:
        """ "▸ rollout × 65,536: 65,534 generate · 2 stragglers", across the columns."""
        total = sum(self.widths) + len(self.widths)
        return [" ", f"{'▾' if g.open else '▸'} {g.role} × {g.n:,}: {g.summary()}"[:total].ljust(total)]

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
            row = self.rows[index] if (self._state and index < len(self.rows)) else None
            w = self._state.workers.get(row[1]) if self._state and row and row[0] == "worker" else None
            if w is None and (row is None or row[0] != "group"):
                return Strip.blank(width, base)
            style = base
            if index % 2:
                style += self.get_component_rich_style("workers-table--odd")
            if w is None:
                style += self.get_component_rich_style("workers-table--group")
            if index == self.cursor:
                style += self.get_component_rich_style("workers-table--cursor")
            if w is None:
                assert row is not None  # (a group's line)
                text = self.group_line(row[1])
            else:
                name = self.row_style(w)
                if name is not None:
                    style += self.get_component_rich_style(name, partial=True)
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
        if self.selected is not None:
            self.post_message(self.Selected(self.selected))
        elif 0 <= self.cursor < len(self.rows):  # a group's line: open it, or close it
            self._toggled.symmetric_difference_update({self.rows[self.cursor][1].key})
            self.rebuild()
            self.refresh()

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:
            return
        index = int(self.scroll_y) + offset.y - 1
        if 0 <= index < len(self.order):
            self.cursor = index
            if event.chain == 2:
                self.action_select()
