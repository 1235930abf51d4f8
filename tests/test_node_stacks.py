"""Stack capture of local processes that do not cooperate: holding the GIL in C, stopped, gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gkd_core.node import stacks

HOLD_GIL = textwrap.dedent("""
    import re, sys
    def hold_the_gil():
        # catastrophic backtracking: minutes inside the regex engine's C loop, GIL held throughout
        re.fullmatch(r"(a|aa)*c", "a" * 64)
    print("ready", flush=True)
    hold_the_gil()
""")

SLEEPER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from gkd_core.node.stacks import install_faulthandler
    if len(sys.argv) > 1:
        install_faulthandler(Path(sys.argv[1]))
    def sleeping_beauty():
        print("ready", flush=True)
        time.sleep(120)
    sleeping_beauty()
""")


def start(code: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        try:
            os.kill(p.pid, signal.SIGCONT)
        except OSError:
            pass
        p.kill()
        p.wait(10)


def root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_process_holding_the_gil_in_c_shows_its_function(procs):
    p = start(HOLD_GIL)
    procs.append(p)
    time.sleep(0.3)
    t0 = time.monotonic()
    cap = stacks.capture(p.pid, timeout_s=4.0)
    assert time.monotonic() - t0 < 5.0
    assert cap.method == "py-spy", cap.error
    assert "hold_the_gil" in cap.text


def test_a_stopped_process_gets_a_clear_note_in_time(procs):
    p = start(SLEEPER.format(root=root()))
    procs.append(p)
    os.kill(p.pid, signal.SIGSTOP)
    time.sleep(0.2)
    t0 = time.monotonic()
    cap = stacks.capture(p.pid, timeout_s=4.0)
    assert time.monotonic() - t0 < 5.0
    assert "is stopped" in cap.error and f"kill -CONT {p.pid}" in cap.error
    if cap.text:  # read without attaching, where py-spy can
        assert "sleeping_beauty" in cap.text


def test_a_gone_process_is_said_to_be_gone():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    cap = stacks.capture(p.pid, timeout_s=2.0)
    assert "is gone" in cap.error and not cap.text


def test_faulthandler_answers_when_py_spy_cannot(procs, tmp_path, monkeypatch):
    p = start(SLEEPER.format(root=root()), str(tmp_path))
    procs.append(p)
    monkeypatch.setattr(stacks, "py_spy_path", lambda: None)
    cap = stacks.capture(p.pid, timeout_s=3.0, faulthandler_dir=tmp_path)
    assert cap.method == "faulthandler" and "sleeping_beauty" in cap.text
    assert "py-spy is not installed" in cap.error  # says why the better way was not used


def test_many_at_once_take_as_long_as_one(procs):
    for _ in range(4):
        procs.append(start(SLEEPER.format(root=root())))
    t0 = time.monotonic()
    caps = stacks.capture_many({f"w/{i}": p.pid for i, p in enumerate(procs)}, timeout_s=4.0)
    assert time.monotonic() - t0 < 5.0
    assert all("sleeping_beauty" in c.text for c in caps.values()), {k: c.error for k, c in caps.items()}
