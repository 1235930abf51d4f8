"""`gkd-tui attach --ray-address`: a Ray job (no gkd imports) whose actor no node can host."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

JOB = """
import time, ray
ray.init(num_cpus=2)
@ray.remote(num_gpus=8, resources={"accelerator_x": 1})
class RolloutWorker:
    def generate(self):
        return 1
workers = [RolloutWorker.remote() for _ in range(2)]
print("created", flush=True)
ready, _ = ray.wait([w.generate.remote() for w in workers], timeout=3600)
"""


@pytest.fixture
def unschedulable_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    seen = [proc.stdout.readline() for _ in range(1)]
    deadline = time.monotonic() + 120
    while "created" not in "".join(seen) and time.monotonic() < deadline and proc.poll() is None:
        seen.append(proc.stdout.readline())
    assert "created" in "".join(seen), "".join(seen)
    yield proc
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def test_plain_attach_says_no_node_can_host_it_with_the_demand(unschedulable_job):
    out = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "attach", "--ray-address", "auto", "--plain"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    line = next((line for line in out.stdout.splitlines() if "cannot be scheduled" in line), "")
    assert line.startswith("CRITICAL") and "2 RolloutWorker actors" in line, out.stdout
    assert "GPU 8" in line and "accelerator_x 1" in line and "the largest of 1 node has" in line, line
