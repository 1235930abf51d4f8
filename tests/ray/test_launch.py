"""`gkd-tui launch` on the embedded default (the trainer on a local Ray cluster): detached, and attached."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, gkd_tui


@pytest.mark.slow
def test_launch_detaches_and_restart_dry_run_shows_the_diff(gkd_home):
    r = gkd_tui("launch", "trainer.total_steps=100000", "--detach", home=gkd_home)
    assert r.returncode == 0, r.stderr
    run = (gkd_home / "runs" / "latest").resolve()
    try:
        d = gkd_tui("restart", "--smaller", "--dry-run", home=gkd_home)
        assert d.returncode == 0 and "rollout.n_workers: 2 -> 1" in d.stdout
    finally:
        s = gkd_tui("stop", home=gkd_home)
    assert s.returncode == 0 and s.stdout.startswith("stopping: the driver (pid "), s.stdout
    pid = json.loads((run / "endpoints.json").read_text())["supervisor_pid"]
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("the launched supervisor did not stop")


@pytest.mark.slow
def test_launch_without_detach_attaches_and_follows(gkd_home):
    """Without a TTY, launch attaches as text: the run's events follow the launch line."""
    p = subprocess.Popen([sys.executable, "-m", "gkd_tui.cli", "launch", "trainer.total_steps=100000"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                         env=dict(os.environ, GKD_HOME=str(gkd_home)))
    lines: list[str] = []
    try:
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(lines) < 4 and p.poll() is None:
            lines.append(p.stdout.readline())
        text = "".join(lines)
        assert "launched run" in text and "Traceback" not in text and len(lines) >= 4, text
    finally:
        p.kill()
        p.wait(10)
        gkd_tui("stop", home=gkd_home)
