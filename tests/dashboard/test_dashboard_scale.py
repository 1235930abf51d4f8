"""The workers table at the largest size: 65,536 workers on one screen, what is wrong first."""

from __future__ import annotations

from pathlib import Path

import pytest

from gkd_core.diagnosis import diagnose
from gkd_core.state import RunState
from gkd_core.state.liveness import Limits
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_tui.app import GkdApp
from gkd_tui.sources.replay import ReplaySource
from gkd_tui.widgets import worker_groups
from gkd_tui.widgets.workers_table import RESORT_S, SLICES, WorkersTable

WORKERS, PER_NODE = 65_536, 8
STRAGGLERS = ("rollout/17", "rollout/40211")
T0 = 1_790_000_000.0  # a fixed clock: the capture is the same on every run
NOW = T0 + 30.0


def recording(path: Path) -> Path:
    """A 65,536-worker step: every rollout enters the weight sync of step 5, all but two leave it
    within 20 ms, and the two are still in it 30 s later. The alerts are the diagnosis's own."""
    lines: list[ev.Event] = [ev.RunEvent(src="supervisor", run="scale", state="running", total_steps=100, ts=T0 - 60,
                                         heartbeat_s=1.0, heartbeat_log_s=10.0)]
    for i in range(WORKERS):
        node = f"node-{i // PER_NODE}"
        lines.append(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=node, pid=10_000 + i,
                                    gpus=[i % PER_NODE], via=f"agent/{node}", ts=T0 - 50))
    for i in range(WORKERS):
        lines.append(ev.PhaseEvent(src=f"rollout/{i}", phase="sync_weights", step=5, ts=T0))
    for i in range(WORKERS):
        if f"rollout/{i}" not in STRAGGLERS:
            lines.append(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", step=5, ts=T0 + 0.02))
    for n in range(WORKERS // PER_NODE):
        beats = [ev.Beat(f"rollout/{i}", NOW - 0.5, "generate", 29.0, 2 << 30, 95.0, 0)
                 for i in range(n * PER_NODE, (n + 1) * PER_NODE)]
        lines.append(ev.HeartbeatsEvent(src="supervisor", beats=beats, ts=NOW - 0.5))
    return recorded(path, lines)


def recorded(path: Path, lines: list[ev.Event], codes: str = "") -> Path:
    """``lines`` written to ``path`` as a run's log, followed by the diagnosis's alerts at NOW (those whose code
    begins with ``codes``), stamped as the supervisor's."""
    st = RunState()
    for e in lines:
        st.apply(e)
    alerts = [a for a in diagnose(st, NOW) if a.code.startswith(codes)]
    for a in alerts:
        a.src, a.ts = "supervisor", NOW
    lines = lines + alerts
    for seq, e in enumerate(lines, 1):
        e.seq = seq
    path.write_bytes(b"\n".join(wire.encode(e) for e in lines) + b"\n")
    return path


@pytest.fixture(scope="module")
def big_run(tmp_path_factory) -> Path:
    return recording(tmp_path_factory.mktemp("scale") / "events.jsonl")


def at_now():
    async def run_before(pilot):
        pilot.app.source.seek(NOW)
        await pilot.pause()
        pilot.app.redraw()
        await pilot.pause()
    return run_before


def test_two_stragglers_among_65536_are_on_the_first_screen(snap_compare, big_run):
    # (how long the replay takes to open is bench_dashboard.py's to measure: "replay from keyframes")
    source = ReplaySource(big_run)
    source.seek(NOW)
    named = sorted(t for a in source.state.alerts.values() if a.code == "straggler" for t in a.targets)
    assert named == sorted(STRAGGLERS)
    assert snap_compare(GkdApp(ReplaySource(big_run)), terminal_size=(80, 24), run_before=at_now())


async def test_enter_opens_the_group_and_the_filter_reaches_any_worker(big_run):
    app = GkdApp(ReplaySource(big_run))
    async with app.run_test(size=(120, 36)) as pilot:
        await at_now()(pilot)
        table = app.query_one(WorkersTable)
        # the group's line, then its two stragglers; the other 65,534 are behind the line
        assert table.order[:3] == ["group:rollout", *sorted(STRAGGLERS, key=lambda s: int(s.split("/")[1]))]
        assert table.row_count == 3
        table.cursor = 0
        await pilot.press("enter")
        await pilot.pause()
        assert table.row_count == 1 + WORKERS
        await pilot.press("enter")
        await pilot.pause()
        assert table.row_count == 3
        # by name, node or pid, any worker, in its group
        for text, want in (("rollout/31337", "rollout/31337"), ("node-4000 ", None), ("pid-less", None)):
            await pilot.press("slash", *text.strip(), "enter")
            await pilot.pause()
            shown = table.workers_shown
            if want:
                assert want in shown
            elif text.startswith("node-4000"):
                assert set(shown) >= {f"rollout/{i}" for i in range(32000, 32008)}
            await pilot.press("escape")
        await pilot.press("slash", *"42767", "enter")  # rollout/42767, and pid 10,000 + 32,767
        await pilot.pause()
        assert sorted(table.workers_shown) == ["rollout/32767", "rollout/42767"]


async def test_a_large_run_s_rows_follow_in_slices_one_a_redraw(big_run):
    """At 65,536 workers a redraw takes an eighth of the pass over the workers, not all of it (60-150 ms on a
    busy machine, where a phase change waited for it on its way to the screen); the rows shown meanwhile stay
    the last pass's, and the pass ends with the rows a whole one makes. What a person changes is whole at once."""
    app = GkdApp(ReplaySource(big_run))
    async with app.run_test(size=(120, 36)) as pilot:
        await at_now()(pilot)
        table = app.query_one(WorkersTable)
        whole = list(table.order)
        limits = Limits(app.source.state.heartbeat_s, app.stall_s)
        assert whole == [row[1].key if row[0] == "group" else row[1]
                         for row in worker_groups.build(app.source.state, NOW, limits)]
        table._built_at -= 2 * RESORT_S  # a pass is due
        shown, redraws = table.rows, 0
        while True:
            app.redraw()
            redraws += 1
            if table._pass is None:
                break
            assert table.rows is shown  # the last pass's, until this one is done
        assert redraws == SLICES
        assert table.rows is not shown and table.order == whole
        table._built_at -= 2 * RESORT_S
        app.redraw()
        assert table._pass is not None
        app.filter_text = "42767"  # typed in the middle of a pass: its rows at once
        app.redraw()
        assert table._pass is None
        assert sorted(table.workers_shown) == ["rollout/32767", "rollout/42767"]


def gpu_recording(path: Path, nodes: int = 1024) -> Path:
    """``nodes`` nodes of 8 GPUs read for two minutes, each node's batch every 10 s;
    GPU 3 of node 7 full of memory at 0 % from the first minute. The alerts are the diagnosis's own."""
    lines: list[ev.Event] = [ev.RunEvent(src="supervisor", run="gpus", state="running", total_steps=100, ts=T0 - 120)]
    for t in range(-120, 1, 10):
        for n in range(nodes):
            lines.append(ev.GpusEvent(src=f"agent/node-{n}", node=f"node-{n}", ts=NOW + t - 5, readings=[
                ev.GpuReading(index=i, util=0.0 if (n, i) == (7, 3) and t >= -60 else 97.0,
                              mem_used=(79 if (n, i) == (7, 3) and t >= -60 else 60) << 30, mem_total=80 << 30,
                              temp=70.0, power=600.0, pids=[10_000 + 8 * n + i]) for i in range(8)]))
    return recorded(path, lines, codes="gpu_")


async def test_8192_gpus_are_their_sums_and_the_gpus_the_diagnosis_names(tmp_path):
    """A run of 8,192 GPUs: the GPU pane says what holds for all of them and shows the GPU the diagnosis names (not
    8,192 rows, ten times a second), the same as the diagnosis's alert."""
    from gkd_tui.widgets.nvml_pane import ROWS_ALL, NvmlPane

    app = GkdApp(ReplaySource(gpu_recording(tmp_path / "events.jsonl")))
    async with app.run_test(size=(160, 48)) as pilot:
        pilot.app.source.seek(NOW)
        await pilot.pause()
        pilot.app.redraw()
        await pilot.pause()
        named = [t for a in app.source.state.alerts.values() if a.code == "gpu_idle_full" for t in a.targets]
        assert named[0] == "gpu node-7/3", named
        text = str(app.query_one(NvmlPane).render())
        lines = text.splitlines()
        assert lines[0].startswith("8,192 GPUs: utilisation 97 % on average, memory 75 %; 1 at 0 %; 1 named, below"), \
            lines[0]
        assert len(lines) <= 1 + ROWS_ALL and "GPU3 node-7" in lines[1] and "util   0%" in lines[1], lines
        await pilot.press("q")
