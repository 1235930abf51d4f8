"""The driver's SIGTERM reaches its process group (gkd_core/lifeline.py): what a supervisor killed -9 cannot
send itself. Real processes: a group leader as the supervisor starts the driver (a session of its own), a
child in its group standing for Ray's head processes; and the same call in a process that leads no group,
whose group (a user's shell job) it must leave alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.process

# The process under test: starts a child in its own group (`sleep`), says both pids, then passes its SIGTERMs
# on, with the handler Ray's ray.init leaves in place before it (sys.exit), and waits.
LEADER = """
import os, signal, subprocess, sys, time
from gkd_core.lifeline import pass_sigterm_to_group
child = subprocess.Popen(["sleep", "60"])
signal.signal(signal.SIGTERM, lambda s, f: sys.exit(0))
pass_sigterm_to_group()
print(os.getpid(), child.pid, flush=True)
time.sleep(60)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def start(code: str, **kw) -> tuple[subprocess.Popen, list[int]]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT, **kw)
    return proc, [int(x) for x in proc.stdout.readline().split()]


def test_a_sigterm_to_the_group_leader_ends_its_group_and_then_itself():
    proc, (leader, child) = start(LEADER, start_new_session=True)
    try:
        os.kill(leader, signal.SIGTERM)  # to the leader alone, as the kernel's PDEATHSIG is
        assert proc.wait(10) == 0, "the handler in place before (sys.exit) did not run"
        assert wait_gone(child, 10), "the child in the leader's group did not get the SIGTERM"
    finally:
        for pid in (leader, child):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_process_that_leads_no_group_leaves_its_group_alone():
    # a leader that only waits (the user's shell), and under it the process under test, in the shell's group
    shell = subprocess.Popen([sys.executable, "-c", f"""
import subprocess, sys, time
inner = subprocess.Popen([sys.executable, "-c", {LEADER!r}], stdout=subprocess.PIPE, text=True)
print(inner.stdout.readline().strip(), flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    inner, child = (int(x) for x in shell.stdout.readline().split())
    try:
        os.kill(inner, signal.SIGTERM)
        assert wait_gone(inner, 10), "its own SIGTERM still ends it (the handler before)"
        time.sleep(0.5)
        assert shell.poll() is None and alive(child), "a SIGTERM went to a group the process does not lead"
    finally:
        os.killpg(shell.pid, signal.SIGKILL)
        shell.wait(10)
