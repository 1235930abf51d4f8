"""The dashboard: one Textual app over one RunState, fed by a live run or a replay.

Data flows one way: the source applies events to its RunState (under its lock); a timer
redraws every pane from that state twice a second. No pane keeps state of its own.
"""

from __future__ import annotations

import time

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Input

from gkd_tui.widgets.log_tail import LogTail
from gkd_tui.widgets.metrics_pane import MetricsPane
from gkd_tui.widgets.nvml_pane import NvmlPane
from gkd_tui.widgets.run_header import RunHeader
from gkd_tui.widgets.sync_gauge import SyncGauge
from gkd_tui.widgets.teacher_pane import TeacherPane
from gkd_tui.widgets.workers_table import WorkersTable

REFRESH_S = 0.5


class GkdApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "gkd-tui"
    BINDINGS = [
        Binding("q", "detach", "Detach (the run goes on)"),
        Binding("slash", "filter", "Filter rows"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        # replay keys win over the table's own (End would scroll it otherwise)
        Binding("space", "toggle_play", "Play/pause (replay)", show=False, priority=True),
        Binding("right", "step", "Step (replay)", show=False, priority=True),
        Binding("end", "to_end", "Jump to end (replay)", show=False, priority=True),
        Binding("home", "to_start", "Restart (replay)", show=False, priority=True),
        Binding("plus,equals_sign", "speed(True)", "Faster (replay)", show=False),
        Binding("minus", "speed(False)", "Slower (replay)", show=False),
    ]

    def __init__(self, source, stall_s: float = 10.0):
        super().__init__()
        self.source = source
        self.stall_s = stall_s
        self.filter_text = ""
        self._last_tick = time.monotonic()

    def compose(self) -> ComposeResult:
        yield RunHeader()
        with Horizontal(id="middle"):
            table = WorkersTable()
            table.border_title = "workers"
            yield table
            with Vertical(id="side"):
                sync = SyncGauge()
                sync.border_title = "weight sync"
                yield sync
                teacher = TeacherPane()
                teacher.border_title = "teacher"
                yield teacher
                nvml = NvmlPane()
                nvml.border_title = "GPU / NVML"
                yield nvml
        with Horizontal(id="bottom"):
            metrics = MetricsPane()
            metrics.border_title = "metrics"
            yield metrics
            logs = LogTail()
            logs.border_title = "log"
            yield logs
        yield Input(placeholder="filter workers (src, phase or node); enter to apply, escape to clear", id="filter")
        yield Footer()

    def on_mount(self) -> None:
        self.source.start()
        self.redraw()
        self.set_interval(REFRESH_S, self.redraw)

    def redraw(self) -> None:
        now_wall = time.monotonic()
        tick = getattr(self.source, "tick", None)
        if tick is not None:
            tick(now_wall - self._last_tick)
        self._last_tick = now_wall
        with self.source.lock:
            st = self.source.state
            now = self.source.now()
            self.query_one(RunHeader).show(st, now, self.source.describe())
            self.query_one(WorkersTable).show(st, now, self.stall_s, self.filter_text)
            self.query_one(SyncGauge).show(st, now)
            self.query_one(TeacherPane).show(st, now)
            self.query_one(NvmlPane).show(st, now)
            self.query_one(MetricsPane).show(st, now)
            self.query_one(LogTail).show(st, now)

    # --- actions -------------------------------------------------------------------------

    def action_detach(self) -> None:
        """Leave the dashboard; the run is never stopped from here."""
        self.source.stop()
        self.exit()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("-visible")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value = ""
        box.remove_class("-visible")
        self.filter_text = ""
        self.query_one(WorkersTable).focus()
        self.redraw()

    def on_input_submitted(self, message: Input.Submitted) -> None:
        # the "/" that opened the box can arrive in it too: it is never part of a filter
        self.filter_text = message.value.strip().lstrip("/")
        message.input.remove_class("-visible")
        self.query_one(WorkersTable).focus()
        self.redraw()

    def _replay(self, name: str, *args) -> None:
        fn = getattr(self.source, name, None)
        if fn is None:
            self.notify("this is a live run: replay keys do nothing here", severity="warning", timeout=2)
            return
        fn(*args)
        self.redraw()

    def action_toggle_play(self) -> None:
        self._replay("toggle")

    def action_step(self) -> None:
        self._replay("step")

    def action_to_end(self) -> None:
        self._replay("to_end")

    def action_to_start(self) -> None:
        self._replay("to_start")

    def action_speed(self, up: bool) -> None:
        self._replay("faster", up)
