"""The node agent's reading of its node's CPU, on real processes: which are the run's, and what the
others hold."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from gkd_core import proctree
from gkd_core.node.cpu_load import CpuLoad, processes

SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]
BUSY = [sys.executable, "-c", "while True: pass"]
# a raylet's stand-in: a process with a worker under it, and that worker's own child (an engine)
RAYLET = [sys.executable, "-c", "import subprocess, sys, time\n"
          "w = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, \"-c\", \"import time; time.sleep(120)\"]); time.sleep(120)'])\n"
          "time.sleep(120)"]


def _tree(pid: int, want: int, timeout_s: float = 30.0) -> list[int]:
    """``pid``'s descendants, once there are ``want`` of them (python takes a moment to start its child)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        found = proctree.descendants(pid, limit=want)
        if len(found) >= want:
            return found
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} did not start {want} processes under it within {timeout_s:g} s")


def test_the_runs_processes_are_under_its_raylet_or_carry_its_id_and_the_rest_is_outside():
    procs: list[subprocess.Popen] = []
    try:
        raylet = subprocess.Popen(RAYLET)
        carrier = subprocess.Popen(SLEEP, env={**os.environ, "GKD_RUN_ID": "run-a"})  # the driver, say
        other_run = subprocess.Popen(SLEEP, env={**os.environ, "GKD_RUN_ID": "run-b"})
        stranger = subprocess.Popen(SLEEP, env={k: v for k, v in os.environ.items() if k != "GKD_RUN_ID"})
        procs += [raylet, carrier, other_run, stranger]
        worker, engine = _tree(raylet.pid, 2)
        inside = CpuLoad("run-a", ray_root=raylet.pid).run_pids(processes())
        assert {raylet.pid, worker, engine, carrier.pid} <= inside
        assert os.getpid() in inside  # the process that started the run's carrier (here the test; the supervisor)
        assert other_run.pid not in inside and stranger.pid not in inside
    finally:
        for p in procs:
            for pid in proctree.descendants(p.pid):
                os.kill(pid, 9)
            p.kill()
            p.wait(10)


def test_what_a_process_outside_the_run_holds_is_counted_as_outside():
    busy = subprocess.Popen(BUSY)
    try:
        load = CpuLoad("run-a", ray_root=os.getpid())  # the test's own children are the run's ...
        assert load.sample() is None  # the first reading has nothing to compare with
        time.sleep(1.0)
        inside_view = busy.pid not in {pid for pid, _, _ in load.sample().top}
        load = CpuLoad("run-a", ray_root=1 << 22)  # ... or not: a raylet that is no process here
        load.sample()
        before = proctree.cpu_seconds(busy.pid)[1]
        t0 = time.monotonic()
        time.sleep(1.0)
        got = load.sample()
        held = (proctree.cpu_seconds(busy.pid)[1] - before) / (time.monotonic() - t0)  # cores' worth, read alike
    finally:
        busy.kill()
        busy.wait(10)
    assert inside_view
    assert got.cores == os.cpu_count() and got.busy >= got.outside
    assert got.outside >= held - 0.05  # at least what the loop held (two readings a few clock ticks apart)
