"""The dashboard under Textual's pilot, on a recorded hang_demo run (real events, real reducer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_tui.app import GkdApp
from gkd_tui.sources.replay import ReplaySource
from gkd_tui.widgets.sync_gauge import SyncGauge
from gkd_tui.widgets.workers_table import WorkersTable

ROOT = Path(__file__).resolve().parents[2]


RECORDING = ROOT / "screenshots" / "hang_demo.events.jsonl"


def events():
    return [json.loads(line) for line in RECORDING.read_text().splitlines() if line.strip()]


def near_timeout_ts() -> float:
    evs = events()
    out = next(e for e in evs if e["kind"] == "sync" and e["state"] == "timed_out")
    start = next(e for e in evs if e["kind"] == "sync" and e["state"] == "started" and e["sync_id"] == out["sync_id"])
    return start["ts"] + 0.85 * out["timeout_s"]


def seek_to(ts: float):
    async def run_before(pilot):
        pilot.app.source.seek(ts)
        await pilot.pause()
        pilot.app.redraw()  # again, once the layout has settled: panes size their content to fit
        await pilot.pause()
    return run_before


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
def test_main_screen_snapshot(snap_compare, size):
    app = GkdApp(ReplaySource(RECORDING))
    assert snap_compare(app, terminal_size=size, run_before=seek_to(near_timeout_ts()))


async def test_replay_to_the_end_names_the_straggler():
    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("end")
        await pilot.pause()
        src = app.source
        assert src.cursor == len(src.events) and not src.playing
        gauge = str(app.query_one(SyncGauge).render())
        assert "timed_out" in gauge and "rollout/1" in gauge
        table = app.query_one(WorkersTable)
        assert table.row_count >= 5 and "rollout/1" in table.order
        await pilot.press("home")
        assert src.cursor == 0
        await pilot.press("right")
        assert src.cursor >= 1


async def test_filter_keeps_matching_rows_and_q_leaves_the_dashboard():
    """(That q leaves a live run running: tests/process/test_dashboard_live.py.)"""
    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("end", "slash", *"rollout", "enter")
        await pilot.pause()
        keys = sorted(app.query_one(WorkersTable).workers_shown)
        assert keys == ["rollout/0", "rollout/1"]
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running  # q itself ended it, before the pilot's own exit
    assert app.return_code == 0


async def test_readonly_has_no_cancel_or_restart():
    app = GkdApp(ReplaySource(RECORDING), readonly=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("c", "r")
        await pilot.pause()
        assert app.screen is app.screen_stack[0]  # nothing opened
        await pilot.press("question_mark")
        await pilot.pause()
        assert type(app.screen).__name__ == "HelpScreen"


async def toasts_after(app, *keys) -> list:
    """The notifications the keys lead to, once the actions' workers have finished."""
    from textual.notifications import Notify

    seen = []
    async with app.run_test(size=(100, 30), message_hook=lambda m: isinstance(m, Notify) and seen.append(m)) as pilot:
        for key in keys:  # one at a time: an action replaces a pending one of its group
            await pilot.press(key)
            await app.workers.wait_for_complete()
            await pilot.pause()
    return [m.notification for m in seen]


async def test_an_action_this_view_cannot_do_is_one_warning_naming_it():
    said = await toasts_after(GkdApp(ReplaySource(RECORDING)), "D", "r", "b")
    assert [(n.message, n.severity) for n in said] == [
        ("dump stacks: a replay has no run to act on", "warning"),
        ("restart: a replay has no run to act on", "warning"),
        ("bundle: this view has no run directory", "warning")]


async def test_an_action_that_fails_is_one_error_naming_it_and_the_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "events.jsonl").write_bytes(RECORDING.read_bytes())
    (run / "config.yaml").write_text("{}\n")
    (run / "bundles").write_text("a file where the bundles' folder goes\n")
    [toast] = await toasts_after(GkdApp(ReplaySource(run / "events.jsonl")), "b")
    assert toast.severity == "error" and toast.message.startswith("bundle: [Errno 17] File exists"), toast
    assert not toast.markup  # "[Errno 17]" is shown, not read as a style


def test_log_follower_reads_appended_lines_and_keeps_partial_ones(tmp_path):
    import time as _time

    from gkd_tui.sources.log_follower import LogFollower

    log = tmp_path / "driver.log"
    log.write_text("first\n\x1b[36m(Actor pid=1)\x1b[0m second\n")
    f = LogFollower(tmp_path)
    f.start()
    try:
        assert list(f.lines) == ["driver: first", "driver: (Actor pid=1) second"]
        with open(log, "a") as out:
            out.write("third\nhalf")
        deadline = _time.monotonic() + 5
        while "driver: third" not in f.lines and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert list(f.lines)[-1] == "driver: third"  # "half" waits for its newline
    finally:
        f.stop()


async def test_the_colours_are_the_themes_and_without_colour_attributes_say_them(monkeypatch):
    from textual.theme import Theme

    from gkd_tui.widgets import styles
    from gkd_tui.widgets.run_header import RunHeader

    monkeypatch.delenv("NO_COLOR", raising=False)
    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(100, 30)) as pilot:
        header, table = app.query_one(RunHeader), app.query_one(WorkersTable)
        trouble = header.tone(styles.TROUBLE)
        assert trouble.bold and trouble.color.number == 1  # the terminal's own red
        assert table.get_component_rich_style(styles.TROUBLE, partial=True) == trouble  # a row says it alike
        app.register_theme(Theme("mine", primary="#0178d4", variables={"severity-critical": "#ff00ff"}))
        app.theme = "mine"
        await pilot.pause()
        assert header.tone(styles.TROUBLE).color.triplet == (255, 0, 255)  # a theme recolours it
        assert header.tone(styles.STATE["running"]).color.number == 2  # and leaves the others be
    # https://no-color.org: what red said is reversed, what yellow said underlined
    monkeypatch.setenv("NO_COLOR", "1")
    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(100, 30)):
        header, table = app.query_one(RunHeader), app.query_one(WorkersTable)
        for name in (styles.TROUBLE, styles.FAILURE, styles.SEVERITY["critical"], styles.STATE["failed"]):
            assert header.tone(name).reverse and header.tone(name).bold, name
        for name in (styles.WARNING, styles.CAUTION, styles.SEVERITY["warn"], styles.STATE["starting"]):
            assert header.tone(name).underline and not header.tone(name).reverse, name
        assert not (header.tone(styles.OK).reverse or header.tone(styles.OK).underline)
        assert table.get_component_rich_style(styles.TROUBLE, partial=True).reverse


async def test_the_stack_viewer_opens_on_the_stack_so_q_closes_it():
    from textual.widgets import TextArea

    from gkd_tui.screens.stacks import StackScreen

    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(80, 24)) as pilot:
        app.source.seek(near_timeout_ts())
        stacks = {t: r for t, r in app.source.state.stacks.items() if r.dump_id == "all"}
        await app.push_screen(StackScreen(stacks, "all"))
        await pilot.pause()
        assert isinstance(app.focused, TextArea)  # not the search box, where q would be typed
        await pilot.press("q")
        await pilot.pause()
        assert not isinstance(app.screen, StackScreen)


def test_the_stack_viewer_puts_threads_running_user_code_first():
    from gkd_core.stack_text import user_threads_first

    dump = "\n".join([
        "Process 7: ray::RolloutWorker",
        'Thread 7 (idle): "MainThread"',
        "    run_task_loop (ray/_raylet.so)",
        "    main_loop (ray/_private/worker.py:1069)",
        'Thread 9 (idle): "gkd-reporter"',
        "    _run (gkd_core/telemetry/reporter.py:150)",
        'Thread 12 (idle): "ThreadPoolExecutor-0_0"',
        "    sync_rollout_weights (gkd_core/trainer/workers.py:335)",
        "    _worker (concurrent/futures/thread.py:83)",
    ])
    lines = user_threads_first(dump).splitlines()
    assert lines[0] == "Process 7: ray::RolloutWorker" and lines[1].startswith("Thread 12")
    assert sorted(lines) == sorted(dump.splitlines())  # nothing lost


async def test_the_sync_gauge_and_the_details_say_who_is_in_the_collective_and_who_is_not(tmp_path):
    from gkd_core.telemetry import events as ev
    from gkd_core.telemetry import wire
    from gkd_tui.screens.worker_details import WorkerDetails

    t0, lines = 1_795_000_000.0, []
    lines.append(ev.RunEvent(src="supervisor", state="running", ts=t0))
    for rank, src in enumerate(["student/0", "rollout/0", "rollout/1", "rollout/2"]):
        lines.append(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=rank, pid=100 + rank, ts=t0 + 1))
        lines.append(ev.CollectivesEvent(src=src, ts=t0 + 2, groups=[ev.CollectiveProgress(
            group="weight_sync", rank=rank, world=4, entered=56 if src == "rollout/1" else 57, op="broadcast",
            entered_at=t0 + 2, left=56, left_at=t0 + 1.5)]))
    lines.append(ev.SyncEvent(src="driver", sync_id=9, state="started", step=8, ts=t0 + 3))
    lines.append(ev.SyncEvent(src="driver", sync_id=9, state="done", step=8, ts=t0 + 3.1, fingerprint_ok=False,
                              differ=["rollout/2"]))
    lines.append(ev.LogEvent(src="driver", message="a line later", ts=t0 + 20))
    for seq, e in enumerate(lines, 1):
        e.seq = seq
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(wire.encode(e) for e in lines) + b"\n")
    app = GkdApp(ReplaySource(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("end")
        await pilot.pause()
        gauge = str(app.query_one(SyncGauge).render())
        assert "broadcast #57 weight_sync: in 3/4 · not joined: rollout/1" in gauge, gauge
        assert "weights differ after sync 9: rollout/2" in gauge, gauge
        st = app.source.state
        text = WorkerDetails.describe(st, "rollout/1", t0 + 20)
        assert "group weight_sync: rank 2 of 4, entered broadcast #56 18s ago, left it (gkd)" in text, text


async def test_p_opens_the_plots_the_number_keys_switch_them_and_escape_closes_them():
    from textual.widgets import TabbedContent
    from textual_hires_canvas import Canvas

    from gkd_tui.screens.plots import PlotsScreen

    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("end", "p")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PlotsScreen)
        titles = [box.border_title for box in screen.query(".plot-box") if box.display and box.region.width]
        assert titles[0].startswith("loss: ") and titles[1].startswith("KL(teacher‖student): ")
        await pilot.press("2")
        await pilot.pause()
        assert screen.query_one(TabbedContent).active == "plots-1"
        sync = screen.query_one("#plot-1-0").parent.border_title
        timed_out = next(e for e in events() if e["kind"] == "sync" and e["state"] == "timed_out")
        assert sync == (f"each step's sync against its timeout: the longest {timed_out['elapsed_s']:.0f}s, "
                        f"{100 * timed_out['elapsed_s'] / timed_out['timeout_s']:.1f} % of "
                        f"{timed_out['timeout_s']:.0f}s")
        # what the plot drew: the timeout's line across its top row, and the sync climbing to it
        canvas = screen.query_one("#plot-1-0").query_one("#plot", Canvas)
        rows = ["".join(r) for r in canvas._buffer]
        assert rows[1].count("▀") > 0.8 * canvas.size.width
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, PlotsScreen)


async def test_the_pipeline_pane_shows_a_flowing_queue_then_the_tool_that_holds_it(tmp_path):
    """screenshots/pipeline_stall: a real pipeline's run (tests/jobs/ray_async_pipeline.py under `launch --`)
    whose tool stops answering. Before: the queue's rates. During: the queue still, the tool's address with
    its waiter and the wait's age, the trainers idle; the pipeline's plot draws the queue's depth."""
    import gzip
    import re

    from gkd_tui.figures import queues
    from gkd_tui.widgets.pipeline_pane import PipelinePane
    from gkd_tui.widgets.teacher_pane import TeacherPane

    recording = ROOT / "screenshots" / "pipeline_stall.events.jsonl.gz"
    path = tmp_path / "events.jsonl"
    path.write_bytes(gzip.decompress(recording.read_bytes()))
    evs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    named = next(e for e in evs if e["kind"] == "alert" and e["code"] == "external_wait")
    app = GkdApp(ReplaySource(path))
    async with app.run_test(size=(120, 40)) as pilot:
        app.source.seek(named["ts"] - 12)  # the stall began about 5 s before it was named
        await pilot.pause()
        app.redraw()
        pane = app.query_one(PipelinePane)
        said = str(pane.render())
        rates = re.search(r"in ([\d.]+)/s  out ([\d.]+)/s", said)
        assert pane.display and not app.query_one(TeacherPane).display, said
        assert said.startswith("MessageQueue/0 samples") and rates and float(rates[1]) > 1 and float(rates[2]) > 1, said
        app.source.seek(named["ts"] + 15)
        await pilot.pause()
        app.redraw()
        said = str(pane.render())
        assert "in 0.0/s  out 0.0/s" in said, said
        # the samples say their version: those taken, by versions behind the newest put (the trainers take each
        # as it comes, so none behind)
        assert re.search(r"\n  taken, versions behind: 0 ×\d\d+\n", said), said
        tool = re.search(r"127\.0\.0\.1:\d+ outside the job, pid \d+\n  1 waiting \(Rollouter/0\), oldest (\d+)s", said)
        assert tool and int(tool[1]) >= 15, said  # (since its wait began, about 5 s before it was named)
        assert re.search(r"idle Trainer/\d 9\d%", said), said
        figure = queues(app.source.state.series.queues, app.source.state.started)
        assert figure.drawn and figure.lines[0].label == "MessageQueue/0 MessageQueue.samples", figure.title
