"""The dashboard under Textual's pilot on a live run: a real supervisor attached to, its actions sent,
and a hung GPU sampler's banner."""

from __future__ import annotations

import re

import pytest
from conftest import wait_until

from gkd_core.telemetry import ops
from gkd_tui.app import GkdApp
from gkd_tui.widgets.workers_table import WorkersTable


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
        assert "driver" in app.query_one(WorkersTable).order
        assert app.source.state.state == "running"
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running
    # detaching never stops the run: nothing asked the supervisor to, and the steps go on after it
    step = max((e["step"] for e in sup.events() if e["kind"] == "metrics"), default=0)
    wait_until(lambda: max(e["step"] for e in sup.events() if e["kind"] == "metrics") >= step + 3, 10,
               "the run to go on stepping after q")
    assert [e for e in sup.events() if e["kind"] == "action"] == []
    with sup.client() as c:
        assert c.request("ping")["state"] == "running"


@pytest.mark.slow
async def test_d_shows_the_stack_r_restarts_on_the_record_c_cancel_does_nothing(start_supervisor):
    """... and a cancel sent shows the driver's own outcome where c was pressed: the supervisor's receipt
    first, then the driver's answer, an action event carrying the request's id (no polling for it)."""
    from textual.notifications import Notify
    from textual.widgets import Button, TextArea

    from gkd_tui.screens.confirm import ConfirmScreen
    from gkd_tui.screens.stacks import StackScreen
    from gkd_tui.sources.live import LiveSource

    sup = start_supervisor("trainer.total_steps=100000", "rollout.n_workers=4", step_s=0.05)
    sup.wait_driver()
    app = GkdApp(LiveSource(sup.run))
    toasts: list[str] = []
    hook = lambda m: isinstance(m, Notify) and toasts.append(m.notification.message)  # noqa: E731
    async with app.run_test(size=(120, 36), message_hook=hook) as pilot:
        for _ in range(50):
            await pilot.pause(0.1)
            if "driver" in app.source.state.workers:
                break
        app.redraw()
        await pilot.pause()
        # d on the selected worker (the driver): its stack, with the function it is in
        await pilot.press("d")
        for _ in range(80):
            await pilot.pause(0.1)
            if isinstance(app.screen, StackScreen):
                break
        assert isinstance(app.screen, StackScreen)
        text = app.screen.query_one(TextArea).text
        assert "serve_commands" in text and "walk" in text  # the demo driver's hot functions
        await pilot.press("escape")
        # c: focus starts on Cancel; Enter there does nothing
        n_actions = len([e for e in sup.events() if e["kind"] == "action"])
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen) and app.screen.focused.id == "cancel"
        await pilot.press("enter")
        await pilot.pause(0.5)
        assert not isinstance(app.screen, ConfirmScreen)
        assert len([e for e in sup.events() if e["kind"] == "action" and e["op"] == "cancel"]) == 0
        # c on a worker's row offers its task too ("rollout/0" is no Textual id: the dialog maps it)
        from gkd_core.telemetry.reporter import Reporter
        with Reporter("rollout/1", ingest=sup.endpoints["ingest"], heartbeat_s=1.0) as rollout:
            rollout.register("rollout", 1)
            rollout.set_phase("generate", step=1)
            for _ in range(50):
                await pilot.pause(0.1)
                if "rollout/1" in app.source.state.workers:
                    break
        app.redraw()
        await pilot.pause()
        app.query_one(WorkersTable).move_to("rollout/1")
        await pilot.pause()
        worker = app.selected_worker()
        assert worker == "rollout/1", worker
        sent, send = [], app.send
        app.send = lambda args: (sent.append(args), send(args))[1]
        await pilot.press("c")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        [task] = [b for b in app.screen.query(Button) if str(b.label) == f"{worker}'s task"]
        task.press()
        outcome = "cancel failed: the demo driver (gkd_core.demo_driver) does not carry out 'cancel'"
        for _ in range(150):  # (a loaded machine: up to 15 s, left at once when it is there)
            await pilot.pause(0.1)
            if outcome in toasts:
                break
        cancel = [e for e in sup.events() if e["kind"] == "action" and e["op"] == "cancel"]
        # forwarded to the driver, which says what it did with rollout/1's task (the demo has none), both
        # on the record with the request's id; the dashboard said the receipt, then the driver's answer
        assert len(cancel) == 2 and cancel[0]["ok"] and cancel[0]["result"]["forwarded"], cancel
        assert not cancel[1]["ok"] and cancel[1]["by"].startswith("dashboard") and cancel[1]["request"], cancel
        assert cancel[0]["request"] == cancel[1]["request"]
        assert sent == [ops.CancelArgs(target="rollout/1")]  # typed; the mode is the op's default (telemetry/ops)
        shown = [t for t in toasts if t.startswith("cancel")]
        assert shown[-1] == outcome and (len(shown) == 1 or "handed to the driver" in shown[0]), toasts
        # r: the diff first, then the restart on the record
        await pilot.press("r")
        for _ in range(50):
            await pilot.pause(0.1)
            if isinstance(app.screen, ConfirmScreen):
                break
        assert "rollout.n_workers: 4 -> 2" in str(app.screen.body)
        [b for b in app.screen.query(Button) if str(b.label) == "Restart smaller"][0].press()
        for _ in range(50):
            await pilot.pause(0.1)
            if any(e["kind"] == "action" and e["op"] == "restart" for e in sup.events()):
                break
        restart = [e for e in sup.events() if e["kind"] == "action" and e["op"] == "restart"]
        assert restart and restart[0]["ok"] and restart[0]["by"].startswith("dashboard")
        assert n_actions >= 1
        await pilot.press("q")


async def test_a_hung_nvml_sampler_raises_the_banner_on_a_live_dashboard(start_supervisor):
    """The test backend hangs on its third sample; its gpu events reach a real supervisor and the
    dashboard attached to it shows the banner, while the sampler's thread keeps reporting."""
    from gkd_core.node.gpu_sampler import GpuSampler
    from gkd_core.telemetry.reporter import Reporter
    from gkd_tui.sources.live import LiveSource
    from gkd_tui.widgets.nvml_pane import NvmlPane

    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    rep = Reporter("agent/gpu-node", ingest=sup.endpoints["ingest"], heartbeat_s=1.0)
    sampler = GpuSampler("gpu-node", rep.emit, backend="fake:gpus=2,hang_at=3", interval_s=0.5, deadline_s=3.0,
                         smi=None).start()
    app = GkdApp(LiveSource(sup.run))
    try:
        async with app.run_test(size=(160, 48)) as pilot:
            pane = app.query_one(NvmlPane)
            text = ""
            for _ in range(150):
                await pilot.pause(0.1)
                text = str(pane.render())
                if "NVML not answering on gpu-node" in text:
                    break
            assert "NVML not answering on gpu-node" in text, text
            assert "GPU0" in text and "GPU1" in text  # the last readings stay, under the banner
            for _ in range(30):  # the supervisor's critical alert, at the top (alerts run twice a second)
                await pilot.pause(0.1)
                header = str(app.query_one("RunHeader").render())
                if "has not answered" in header:
                    break
            assert "CRITICAL" in header and "NVML on gpu-node has not answered" in header, header
            await pilot.press("q")
    finally:
        sampler.stop()
        rep.close()


@pytest.mark.slow
async def test_b_takes_every_workers_stacks_and_writes_the_bug_report(start_supervisor):
    import tarfile
    from pathlib import Path

    from textual.notifications import Notify

    from gkd_tui.sources.live import LiveSource

    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    said = []
    app = GkdApp(LiveSource(sup.run))
    async with app.run_test(size=(100, 30), message_hook=lambda m: isinstance(m, Notify) and said.append(m)) as pilot:
        for _ in range(50):
            await pilot.pause(0.1)
            if "driver" in app.source.state.workers:
                break
        await pilot.press("b")
        await app.workers.wait_for_complete()
        await pilot.pause()
    messages = [m.notification.message for m in said]
    assert messages[0].startswith("bundle: taking every worker's stacks first"), messages
    written = [m for m in messages if m.startswith("bundle written: ")]
    assert written, messages
    with tarfile.open(Path(written[0].removeprefix("bundle written: "))) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        summary = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/summary.md"))).read()
        stacks = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("/stacks.txt"))).read()
    assert "stacks.txt" in names and "environment.json" in names, names
    # the demo driver answers with its stack in the event (the trainer's also saves it in stacks/DUMP/); the
    # summary's table names the alerts' targets when one is active (a busy machine's straggler), so the
    # driver's stack is looked for in stacks.txt's groups, and in its summary row when it has one
    headers = stacks.decode().split("\n\n")[0].splitlines()
    driver_group = next((line for line in headers if re.search(r"[(,] ?driver[,)]", line)), "")
    assert "demo_driver.py" in driver_group, stacks.decode()[:2000]
    driver_row = next((line for line in summary.decode().splitlines() if line.startswith("| driver |")), "")
    assert "not taken" not in driver_row and (not driver_row or "demo_driver.py" in driver_row), summary.decode()

