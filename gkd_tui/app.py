"""The dashboard: one Textual app over one RunState, fed by a live run or a replay.

Data flows one way: the source applies events to its RunState (under its lock); a timer
redraws the panes from that state ten times a second; a pane repaints only when its text
changed, and the workers table renders only the rows on screen. No pane keeps state of its own.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import msgspec
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.screen import ModalScreen
from textual.widgets import Footer, Input
from textual.worker import Worker

from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import A, Receipt
from gkd_core.telemetry.control import ControlClient, ControlError, ControlUnreachable
from gkd_core.vocab import PAUSED
from gkd_tui.answers import ActionAnswered, PendingAnswers
from gkd_tui.errors import Refused, action_worker, toast_failure
from gkd_tui.screens.confirm import cancel_dialog, restart_dialog
from gkd_tui.screens.help import HelpScreen
from gkd_tui.screens.stacks import StackScreen
from gkd_tui.screens.worker_details import WorkerDetails
from gkd_tui.sources import Source, wait_for
from gkd_tui.theme import THEME_VARIABLES
from gkd_tui.widgets.log_tail import LogTail
from gkd_tui.widgets.metrics_pane import MetricsPane
from gkd_tui.widgets.nvml_pane import NvmlPane
from gkd_tui.widgets.pipeline_pane import PipelinePane
from gkd_tui.widgets.run_header import RunHeader
from gkd_tui.widgets.sync_gauge import SyncGauge
from gkd_tui.widgets.teacher_pane import TeacherPane
from gkd_tui.widgets.workers_table import WorkersTable

REFRESH_S = 0.1  # a phase change is on screen within this plus one frame
STACK_WAIT_S = 6.0
BUNDLE_STACK_WAIT_S = 20.0  # every worker on every node, with their children


def titled(widget, title: str):
    widget.border_title = title
    return widget


def copy_of_state(source):
    """A copy of ``source``'s state, taken under its lock: the source goes on changing its own while a bug
    report is written (seconds)."""
    with source.lock:
        return msgspec.json.decode(msgspec.json.encode(source.state), type=type(source.state))


class GkdApp(App):
    CSS_PATH = Path(__file__).with_name("app.tcss")  # absolute, so subclasses elsewhere find it too
    TITLE = "gkd-tui"
    # an 80x24 terminal over SSH at 3 a.m. is the case to design for (see app.tcss)
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (110, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (32, "-tall")]
    BINDINGS = [
        Binding("q", "detach", "Detach (the run goes on)"),
        Binding("d", "dump_stacks(False)", "Dump stacks"),
        Binding("D", "dump_stacks(True)", "Dump all stacks", show=False),
        Binding("c", "cancel", "Cancel…"),
        Binding("r", "restart", "Restart smaller…"),
        Binding("P", "pause", "Pause/resume the driver", show=False),
        Binding("p", "plots", "Plots"),
        Binding("b", "bundle", "Bundle for a bug report", show=False),
        Binding("question_mark", "help", "Help"),
        Binding("slash", "filter", "Filter rows"),
        Binding("escape", "clear_filter", "Clear filter", show=False),
        # replay keys win over the table's own (End would scroll it otherwise)
        Binding("space", "replay('toggle')", "Play/pause (replay)", show=False, priority=True),
        Binding("right", "replay('step')", "Step (replay)", show=False, priority=True),
        Binding("end", "replay('to_end')", "Jump to end (replay)", show=False, priority=True),
        Binding("home", "replay('to_start')", "Restart (replay)", show=False, priority=True),
        Binding("plus,equals_sign", "replay('faster', True)", "Faster (replay)", show=False),
        Binding("minus", "replay('faster', False)", "Slower (replay)", show=False),
    ]

    def __init__(self, source: Source, stall_s: float = 10.0, readonly: bool = False):
        super().__init__()
        self.source = source
        self.stall_s = stall_s
        self.readonly = readonly
        self._client: ControlClient | None = None
        self.filter_text = ""
        self._last_tick = time.monotonic()
        self._frozen_for = 0
        self.answers = PendingAnswers(self.notify)  # requests made here whose outcome is still to come

    def get_theme_variable_defaults(self) -> dict[str, str]:
        return dict(THEME_VARIABLES)  # what the dashboard's colours say; a theme may override them

    def compose(self) -> ComposeResult:
        yield RunHeader()
        with Horizontal(id="middle"):
            yield titled(WorkersTable(), "workers")
            with Vertical(id="side"):
                yield titled(SyncGauge(), "weight sync")
                yield titled(TeacherPane(), "teacher")
                yield titled(PipelinePane(), "pipeline")
                yield titled(NvmlPane(), "GPU / NVML")
        with Horizontal(id="bottom"):
            yield titled(MetricsPane(), "metrics")
            yield titled(LogTail(), "log")
        yield Input(placeholder="filter workers (name, phase, node or pid); enter to apply, escape to clear",
                    id="filter")
        yield Footer()

    def on_mount(self) -> None:
        # a live run's driver's answers are handed over as they come (a replay has none to hand)
        self.source.on_action = self._hand_over_answer
        self.source.start()
        self.query_one(WorkersTable).focus()  # not the hidden filter box: keys are actions
        self.redraw()
        self._redraw_timer = self.set_interval(REFRESH_S, self.redraw)

    def redraw(self) -> None:
        try:
            self._redraw()
        except NoMatches:
            pass  # the app is closing: its panes are gone before the timer's last tick

    def _redraw(self) -> None:
        now_wall = time.monotonic()
        if self.source.playback is not None:
            self.source.playback.tick(now_wall - self._last_tick)
        self._last_tick = now_wall
        if any(not isinstance(s, ModalScreen) for s in self.screen_stack[1:]):
            return  # a screen over the whole of it (the plots, a dialog on them): drawn again when it closes
        with self.source.lock:
            st = self.source.state
            now = self.source.now()
            self.query_one(RunHeader).show(st, now, self.source.describe())
            self.query_one(WorkersTable).show(st, now, self.stall_s, self.filter_text)
            self.query_one(SyncGauge).show(st, now)
            pipeline = self.query_one(PipelinePane).show(st, now)
            teacher = self.query_one(TeacherPane)
            teacher.display = bool(st.teacher.by_src) or not pipeline  # (a pipeline's job has no teacher of ours)
            teacher.show(st, now)
            self.query_one(NvmlPane).show(st, now)
            self.query_one(MetricsPane).show(st, now)
            follower = self.source.logs
            self.query_one(LogTail).show(st, now, list(follower.lines) if follower else None)
            workers = len(st.workers)
        if workers >= 2 * max(32, self._frozen_for):
            # The app and the run's state are long-lived: move them out of the collector's sight,
            # or every full collection re-scans them (50 ms pauses every few seconds with 4,096
            # workers). Done when the run has doubled in size, so a few times in all.
            gc.freeze()
            self._frozen_for = workers

    # --- actions -------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        if action in ("cancel", "restart", "pause") and (self.readonly or not self.can_control()):
            return False  # --readonly, or nobody to ask: the dangerous actions are not there at all
        return True

    def can_control(self) -> bool:
        """Cancel and restart need someone to ask: a live run has its supervisor; a replay keeps the
        keys and says why they do nothing there; the Ray state source has no one."""
        return self.source.control is not None or self.source.playback is not None

    def selected_worker(self) -> str | None:
        return self.query_one(WorkersTable).selected

    def _control(self) -> ControlClient:
        if self.source.control is None:
            raise Refused("a replay has no run to act on")
        if self._client is None:
            self._client = self.source.control()
        return self._client

    def call(self, args: ops.Answered[A], timeout_s: float = 3.0, request_id: int | None = None) -> A:
        """The supervisor's answer to the op ``args`` are for, from a worker thread; raises
        ControlError/ControlUnreachable."""
        return self._control().call(args, timeout_s=timeout_s, request_id=request_id)

    def hand(self, args: ops.Handed, timeout_s: float = 3.0, request_id: int | None = None) -> Receipt:
        """The op ``args`` are for, handed on to the driver, from a worker thread: the supervisor's receipt (the
        answer comes as an action event with ``request_id``)."""
        return self._control().hand(args, timeout_s=timeout_s, request_id=request_id)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    def action_plots(self) -> None:
        # imported when first asked for: the plots bring numpy (about 25 MB a dashboard need not hold)
        from gkd_tui.screens.plots import PlotsScreen

        self.push_screen(PlotsScreen(self.source))

    def on_workers_table_selected(self, message: WorkersTable.Selected) -> None:
        with self.source.lock:
            screen = WorkerDetails(self.source.state, message.src, self.source.now())
        self.push_screen(screen)

    def action_dump_stacks(self, everyone: bool) -> None:
        if everyone:
            self.dump_stacks([])
            return
        table = self.query_one(WorkersTable)
        targets = table.targets()
        if not targets:  # a group's line with nothing wrong in it: not every worker of a large run
            self.notify("a group's line: enter opens it; d on a worker, D for every worker", timeout=4)
            return
        self.dump_stacks(targets)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        toast_failure(self, event.worker)  # the one error path of the actions below

    @action_worker("dump stacks")
    def dump_stacks(self, targets: list[str]) -> None:
        dump_id = f"d{int(time.time() * 1000)}"
        self.hand(ops.DumpStacksArgs(targets=targets, dump_id=dump_id))  # (a replay refuses at once: shown alone)
        self.call_from_thread(self.notify, f"dumping stacks of {', '.join(targets) or 'every worker'}…", timeout=3)

        def taken(state: RunState) -> dict:
            return state.dump_records(dump_id)

        def complete(state: RunState) -> dict | None:  # the dump's stacks, once answered or all in
            got = taken(state)
            answered = state.dump_answer(dump_id) is not None
            return got if got and (answered or (targets and all(t in got for t in targets))) else None

        got = wait_for(self.source, complete, STACK_WAIT_S)
        if got is None:  # at the deadline: what came
            with self.source.lock:
                got = taken(self.source.state)
        if not got:
            raise TimeoutError(f"no stacks came back within {STACK_WAIT_S:g} s")
        with self.source.lock:
            named = frozenset(t for a in self.source.state.alerts.values() for t in a.targets)
        self.call_from_thread(self.push_screen, StackScreen(got, dump_id, named))

    def action_cancel(self) -> None:
        self.push_screen(cancel_dialog(self.selected_worker()), self._cancel_chosen)

    def _cancel_chosen(self, choice: str | None) -> None:
        if choice is None:
            return  # Cancel: nothing happens
        self.send(ops.CancelArgs(target=choice.removeprefix("worker:")))

    def action_pause(self) -> None:
        """The driver paused at its step's end, or a paused one resumed (telemetry/pausing)."""
        with self.source.lock:
            paused = getattr(self.source.state.workers.get("driver"), "phase", "") == PAUSED
        self.send(ops.ResumeArgs() if paused else ops.PauseArgs())

    def action_restart(self) -> None:
        self.preview_restart()

    @action_worker("restart")
    def preview_restart(self) -> None:
        """The supervisor's dry run first: the dialog shows the config diff it would apply."""
        dry = self.call(ops.RestartArgs(shrink=True, dry_run=True))
        self.call_from_thread(self.push_screen, restart_dialog(dry), self._restart_chosen)

    def _restart_chosen(self, choice: str | None) -> None:
        if choice == "restart":
            self.send(ops.RestartArgs(shrink=True))

    @action_worker(lambda args: ops.OP_OF[type(args)])
    def send(self, args: ops.Answered | ops.Handed) -> None:
        op = ops.OP_OF[type(args)]
        request = self.answers.ask(op)
        answer = (self.hand(args, request_id=request) if isinstance(args, ops.Handed)
                  else self.call(args, request_id=request))
        said = self.answers.receipt(request, op, answer)
        if said is not None:
            self.call_from_thread(self.answers.show_receipt, request, said)

    def _hand_over_answer(self, e: ev.ActionEvent) -> None:
        """(The source's thread) an action that answers a request: to the app's thread, as a message."""
        self.post_message(ActionAnswered(e))

    def on_action_answered(self, message: ActionAnswered) -> None:
        self.answers.hear(message.event)

    def action_bundle(self) -> None:
        self.bundle()

    @action_worker("bundle", group="bundle")
    def bundle(self) -> None:
        """A bug report: on a live run, every worker's stacks are taken for it first (as `D` does)."""
        from gkd_core.bundle import StacksTaken, write_bundle
        from gkd_tui.commands.stacks import stacks_of_dump
        from gkd_tui.render_text import status_text

        run = self.source.run
        if run is None or not Path(run).is_dir():
            raise Refused("this view has no run directory")
        live = self.source.control is not None
        stacks = StacksTaken(note="a replay: none were taken for this bundle; those taken before are in stacks/")
        if live:
            self.call_from_thread(self.notify, "bundle: taking every worker's stacks first…", timeout=4)
            asked_at, dump_id = time.time(), f"bundle-{int(time.time() * 1000)}"
            try:
                self.hand(ops.DumpStacksArgs(dump_id=dump_id))
            except (ControlError, ControlUnreachable) as e:  # the report is wanted most when the run is in trouble
                live = False
                stacks = StacksTaken(note=f"the run refused or did not answer ({e}); those taken before are in stacks/")
            else:
                answered = wait_for(self.source, lambda state: state.dump_answer(dump_id), BUNDLE_STACK_WAIT_S)
                with self.source.lock:
                    stacks = stacks_of_dump(self.source.state, dump_id, answered, asked_at, [], BUNDLE_STACK_WAIT_S)
        state = copy_of_state(self.source)  # and again once the rest is gathered: who joined meanwhile
        out = write_bundle(Path(run), status=status_text(state, self.source.now(), Path(run)), state=state,
                           stacks=stacks, live=live, reread=lambda: copy_of_state(self.source))
        self.call_from_thread(self.notify, f"bundle written: {out}", timeout=8, markup=False)

    def action_detach(self) -> None:
        """Leave the dashboard; the run is never stopped from here."""
        self._redraw_timer.stop()
        self.source.stop()
        if self._client is not None:
            self._client.close()
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

    def action_replay(self, move: str, *args: bool) -> None:
        """A replay key: the recording's clock moved (``Playback``'s method ``move``)."""
        if self.source.playback is None:
            self.notify("this is a live run: replay keys do nothing here", severity="warning", timeout=2)
            return
        getattr(self.source.playback, move)(*args)
        self.query_one(WorkersTable).resort_soon()  # a jump in the recording: the rows follow at once
        self.redraw()
