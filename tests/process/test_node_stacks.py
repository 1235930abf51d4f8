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
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


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


PARENT_OF_ENGINE = textwrap.dedent("""
    import subprocess, sys
    ENGINE = ("def engine_core_busy():\\n    print('engine ready', flush=True)\\n    while True:\\n"
              "        sum(range(1000))\\nengine_core_busy()")
    # a helper titled as Ray titles its workers: Ray's, not this process's work
    ray_like = subprocess.Popen(["ray::IDLE", "-c", "import time; time.sleep(120)"], executable=sys.executable)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE])
    def wait_for_engine():
        print(engine.pid, ray_like.pid, flush=True)
        engine.wait()
    wait_for_engine()
""")


def test_a_process_is_read_with_its_children_but_not_rays(procs):
    """A rollout worker waits on its engine's process: the dump shows both, the engine's frames after the
    worker's own threads, and leaves out a Ray-titled child."""
    from gkd_core import proctree

    parent = subprocess.Popen([sys.executable, "-c", PARENT_OF_ENGINE], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    procs.append(parent)
    engine, ray_like = map(int, parent.stdout.readline().split())
    assert parent.stdout.readline().strip() == "engine ready"  # (the child shares the parent's stdout)
    try:
        assert proctree.descendants(parent.pid) == [engine]
        cap = stacks.capture(parent.pid)
        assert cap.method == "py-spy", cap.error
        own, _, child = cap.text.partition(f"Child process {engine} (")
        # (py-spy's first line is the command, which holds the parent's source: frames are "name (file:line)")
        assert "wait_for_engine (" in own and "engine_core_busy (" not in own
        assert "engine_core_busy (" in child and f"Child process {ray_like} " not in cap.text
        # the worker alone is idle; with its engine it is busy (what the stuck-or-slow verdict reads)
        tree = proctree.TreeCpu(parent.pid)
        own_before = proctree.cpu_seconds(parent.pid)[1]
        time.sleep(1.5)
        assert tree.delta() > 1.0
        assert proctree.cpu_seconds(parent.pid)[1] - own_before < 0.2
    finally:
        os.killpg(parent.pid, signal.SIGKILL)


def test_two_readers_at_once_both_get_its_stack(procs):
    """The dashboard's automatic dump and a user's `d` on one process: ptrace lets one py-spy suspend it,
    and the other got EPERM ("py-spy failed: 9: main", the last line of Rust's backtrace). Both read it."""
    import threading

    p = start(SLEEPER.format(root=root()))
    procs.append(p)
    for _ in range(3):
        go, caps = threading.Barrier(2), []

        def read(go=go, caps=caps):
            go.wait(5)
            caps.append(stacks.capture(p.pid, timeout_s=4.0))

        readers = [threading.Thread(target=read) for _ in range(2)]
        for r in readers:
            r.start()
        for r in readers:
            r.join(10)
        assert [(c.method, c.error) for c in caps] == [("py-spy", "")] * 2
        assert all("sleeping_beauty" in c.text for c in caps)


SEIZE = textwrap.dedent("""
    import ctypes, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    # PTRACE_SEIZE (0x4206): traced, as a debugger holds it, but not stopped
    if libc.ptrace(0x4206, int(sys.argv[1]), None, None) != 0:
        print("seize failed", ctypes.get_errno(), flush=True)
        sys.exit(1)
    print("ready", flush=True)
    time.sleep(120)
""")


def test_a_process_another_tracer_holds_names_the_tracer(procs):
    p = start(SLEEPER.format(root=root()))
    procs.append(p)
    holder = start(SEIZE, str(p.pid))  # (ptrace: root here and in CI)
    procs.insert(0, holder)  # let go first: a traced process that is killed waits for its tracer
    t0 = time.monotonic()
    cap = stacks.capture(p.pid, timeout_s=2.0)
    assert time.monotonic() - t0 < 3.0
    assert not cap.text and "Failed to suspend process" in cap.error, cap.error
    assert f"process {holder.pid}" in cap.error and "is tracing it" in cap.error, cap.error
    assert "9: main" not in cap.error and "backtrace" not in cap.error


def test_native_frames_py_spy_cannot_merge_leave_the_python_frames_with_a_note(procs, tmp_path, monkeypatch):
    """py-spy's known failure on some builds (benfred/py-spy#634): --native cannot merge the frames. Here a
    py-spy that fails so with --native and is the real one without it."""
    real = stacks.py_spy_path()
    fake = tmp_path / "py-spy"
    fake.write_text(f"""#!/bin/sh
case "$*" in *--native*)
  echo 'Error: Failed to merge native and python frames (Have 1 native and 2 python)' >&2; exit 1;;
esac
exec {real} "$@"
""")
    fake.chmod(0o755)
    monkeypatch.setattr(stacks, "py_spy_path", lambda: str(fake))
    p = start(SLEEPER.format(root=root()))
    procs.append(p)
    cap = stacks.capture(p.pid, timeout_s=4.0)
    assert cap.method == "py-spy" and "sleeping_beauty" in cap.text
    assert cap.error == ("native frames not read (py-spy: Failed to merge native and python frames "
                         "(Have 1 native and 2 python)): Python frames only")
