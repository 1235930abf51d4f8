"""`gkd-tui attach --ray-address`: an unmodified Ray job, seen through the Ray state API alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gkd_core.telemetry import ops
from gkd_core.telemetry.control import ControlError
from gkd_tui.app import GkdApp
from gkd_tui.screens.stacks import StackScreen
from gkd_tui.sources.live import LiveSource
from gkd_tui.widgets.workers_table import WorkersTable

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stuck_job():
    """examples/stuck_ray_job.py (no gkd imports), its own local Ray cluster, hung in a sync."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "examples" / "stuck_ray_job.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, cwd=ROOT)
    deadline = time.monotonic() + 120
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        seen.append(line)
        if "syncing weights" in line or proc.poll() is not None:
            break
    assert "syncing weights" in "".join(seen), "".join(seen)
    yield proc
    proc.send_signal(signal.SIGINT)  # the job's own ray.shutdown() takes its local cluster down
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gkd_tui.cli", *args], capture_output=True, text=True, timeout=60,
                          env=env)


def test_plain_attach_shows_the_actor_the_stuck_method_and_its_elapsed_time(stuck_job):
    time.sleep(2.0)
    out = cli("attach", "--ray-address", "auto", "--plain")
    assert out.returncode == 0, out.stdout + out.stderr
    row = next(line for line in out.stdout.splitlines()
               if "sync_rollout_weights" in line and line.startswith("RolloutWorker/"))
    elapsed = row.split("sync_rollout_weights")[1].split()[0]
    assert elapsed.endswith("s") and float(elapsed.rstrip("s").split("m")[-1]) >= 1.0, row


async def test_the_dashboard_shows_it_and_d_dumps_its_stack(stuck_job, start_supervisor):
    """What `attach --ray-address` opens: a run whose driver is the cluster (a look every 2 s, by its supervisor,
    which diagnoses it as any run and takes its stacks), on the dashboard as any live run."""
    sup = start_supervisor("--ray-address", "auto")
    source = LiveSource(sup.run)
    app = GkdApp(source, readonly=True)
    async with app.run_test(size=(120, 36)) as pilot:
        table = app.query_one(WorkersTable)
        for _ in range(150):
            await pilot.pause(0.1)
            with source.lock:
                stuck = [s for s, w in source.state.workers.items() if w.phase == "sync_rollout_weights"]
            if stuck and stuck[0] in table.order:
                break
        assert stuck, source.describe()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # named by its peer, grouped by class and call, on the header
            await pilot.pause(0.2)
            if any(a.code == "straggler" for a in source.state.alerts.values()):
                break
        named = [a for a in source.state.alerts.values() if a.code == "straggler"]
        assert [a.targets for a in named] == [stuck], (source.describe(), list(source.state.alerts.values()))
        assert not app.check_action("cancel", ()) and not app.check_action("restart", ())  # nothing to ask
        table.move_to(stuck[0])
        t0 = time.monotonic()
        await pilot.press("d")
        for _ in range(120):  # (the app's own bound on a dump is STACK_WAIT_S)
            await pilot.pause(0.1)
            if isinstance(app.screen, StackScreen):
                break
        toasts = [n.message for n in app._notifications]
        assert isinstance(app.screen, StackScreen), (time.monotonic() - t0, toasts)
        record = source.state.stacks[stuck[0]]
        assert record.method == "py-spy" and "sync_rollout_weights" in record.text, record.error
        await pilot.press("escape", "q")
    with sup.client() as c:  # a request in its jobs is refused, saying why
        with pytest.raises(ControlError, match="from outside"):
            c.hand(ops.CancelArgs())
        c.call(ops.StopArgs())
    assert sup.wait_exit(15) == 143


def test_without_the_token_it_says_what_is_missing(stuck_job):
    if os.environ.get("RAY_AUTH_MODE") == "disabled":
        pytest.skip("token authentication is off on this machine")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["RAY_AUTH_TOKEN_PATH"] = "/nonexistent/auth_token"
    out = cli("attach", "--ray-address", "auto", "--plain", env=env)
    assert out.returncode == 3
    assert "token authentication" in out.stdout and "ray get-auth-token" in out.stdout


def test_plain_attach_names_the_member_its_peers_left_behind(stuck_job):
    """Both workers were called; one returned at once, the other never does: it, and only it, is the
    straggler, grouped by class and call (no gkd naming), within 30 s of the hang."""
    deadline = time.monotonic() + 30
    while True:
        out = cli("attach", "--ray-address", "auto", "--plain")
        assert out.returncode == 0, out.stdout + out.stderr
        named = [line for line in out.stdout.splitlines() if " still in sync_rollout_weights" in line]
        if named or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    assert named, out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("RolloutWorker/")]
    (hung,) = [r[0] for r in rows if r[2] == "sync_rollout_weights"]
    assert all(line.split()[1] == hung for line in named), named
    assert "its peer finished in" in named[0]
    alerts = [line for line in out.stdout.splitlines() if line.startswith(("WARN", "CRITICAL"))]
    assert all(line.split()[1] == hung for line in alerts), alerts
