"""The dashboard under Textual's pilot, on a recorded hang_demo run (real events, real reducer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gkd_tui.app import GkdApp
from gkd_tui.sources.replay import ReplaySource
from gkd_tui.widgets.sync_gauge import SyncGauge
from gkd_tui.widgets.workers_table import WorkersTable

ROOT = Path(__file__).resolve().parent.parent
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
        pilot.app.redraw()
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
        assert table.row_count >= 5 and "rollout/1" in [str(k.value) for k in table.rows]
        await pilot.press("home")
        assert src.cursor == 0
        await pilot.press("right")
        assert src.cursor >= 1


async def test_filter_keeps_matching_rows_and_q_detaches_without_stopping():
    app = GkdApp(ReplaySource(RECORDING))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("end", "slash", *"rollout", "enter")
        await pilot.pause()
        keys = sorted(str(k.value) for k in app.query_one(WorkersTable).rows)
        assert keys == ["rollout/0", "rollout/1"]
        await pilot.press("q")
    assert app.return_code in (0, None)


@pytest.mark.slow
async def test_live_attach_follows_a_real_supervisor_and_q_leaves_it_running(start_supervisor):
    from gkd_tui.sources.live import LiveSource

    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    app = GkdApp(LiveSource(sup.run))
    async with app.run_test(size=(100, 30)) as pilot:
        for _ in range(100):
            await pilot.pause(0.1)
            if "driver" in app.source.state.workers and (app.source.state.step or 0) > 3:
                break
        app.redraw()
        assert "driver" in [str(k.value) for k in app.query_one(WorkersTable).rows]
        assert app.source.state.state == "running"
        await pilot.press("q")
    with sup.client() as c:
        assert c.request("ping")["state"] == "running"  # detaching never stops the run
