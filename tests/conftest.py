"""Shared fixtures: a private GKD_HOME per test, and real supervisors as real processes; the tiers.

The tests are in tiers by directory, each a marker of the same name (``pytest -m unit``):

- ``tests/unit``: no subprocess, no socket, no Ray; the whole tier in under a minute, the inner
  loop of a change (``pytest tests/unit``). A test there that starts a process, or binds or
  connects a socket, fails and says so (``_unit_stays_in_process``);
- ``tests/dashboard``: the dashboard under Textual's pilot (snapshots per key sequence, 65,536
  workers, the fuzzed dashboard): in the process as well, slower (an app a test);
- ``tests/process``: real processes and sockets (supervisors, agents, the dashboard's command line);
- ``tests/ray``: a real local Ray cluster (the trainer, other people's Ray jobs);
- ``tests/chaos``: every component killed and frozen in turn;
- ``tests/on_verl``, ``tests/on_vllm``: in a venv with verl or vLLM (skipped elsewhere).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from gkd_core import rundir
from gkd_core.telemetry.control import ControlClient

# the tiers' shared helpers assert too: rewritten like a test's, so that a failure there says its values
pytest.register_assert_rewrite("fuzzing", "pipeline_stalls", "tiny_hf")

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
TIERS = ("unit", "dashboard", "process", "ray", "chaos", "on_verl", "on_vllm")
IN_PROCESS = ("unit", "dashboard")  # tiers that may not start a process or reach another


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = Path(item.fspath).resolve().relative_to(HERE).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


class LeftTheProcess(AssertionError):
    """A test of an in-process tier started a process or reached another through a socket."""


@pytest.fixture(autouse=True)
def _unit_stays_in_process(request, monkeypatch):
    if not any(request.node.get_closest_marker(tier) for tier in IN_PROCESS):
        yield
        return
    import socket

    import zmq

    def refuse(what):
        def refused(*a, **kw):
            raise LeftTheProcess(f"{request.node.nodeid}: a test of this tier may not {what}; "
                                 "move it to tests/process")
        return refused

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(os, "fork", refuse("fork"))
    # bind and connect, not the socket itself: an event loop's self-pipe is a socketpair in the process
    monkeypatch.setattr(socket.socket, "bind", refuse("bind a socket"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect a socket"))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse("connect a socket"))
    monkeypatch.setattr(zmq.Context, "socket", refuse("open a ZeroMQ socket"))
    yield


@pytest.fixture(scope="session")
def teacher_cache(tmp_path_factory) -> Path:
    """One cache for the session, so the built-in teacher is trained once, not once per test."""
    return tmp_path_factory.mktemp("gkd-cache")


@pytest.fixture
def gkd_home(tmp_path, monkeypatch, teacher_cache) -> Path:
    home = tmp_path / "gkd"
    home.mkdir()
    (home / "cache").symlink_to(teacher_cache)
    monkeypatch.setenv("GKD_HOME", str(home))
    return home


class RunningSupervisor:
    """``python -m gkd_core run`` in its own process group, with helpers to reach it."""

    def __init__(self, home: Path, args: list[str], env: dict[str, str]):
        self.home = home
        self.run_id = rundir.new_run_id()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gkd_core", "run", *args, "--run-id", self.run_id, "--quiet"],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.run = home / "runs" / self.run_id
        deadline = time.monotonic() + 30
        while not (self.run / "endpoints.json").exists():
            if self.proc.poll() is not None:
                raise RuntimeError(f"supervisor exited {self.proc.returncode}: {self.proc.stdout.read().decode()}")
            if time.monotonic() > deadline:
                raise TimeoutError("supervisor did not write endpoints.json within 30 s")
            time.sleep(0.02)
        self.endpoints = rundir.read_endpoints(self.run)

    def client(self, **kw) -> ControlClient:
        return ControlClient.for_run(self.run, self.endpoints, **kw)

    def wait_driver(self, timeout_s: float = 20.0) -> int:
        """The driver's pid once it has connected its command channel."""
        deadline = time.monotonic() + timeout_s
        with self.client() as c:
            while time.monotonic() < deadline:
                sup = c.request("snapshot")["supervisor"]
                if sup["driver_connected"] and sup["driver_pid"]:
                    return sup["driver_pid"]
                time.sleep(0.1)
        raise TimeoutError("the driver did not connect")

    def events(self) -> list[dict]:
        return logged_events(self.run)

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        """SIGTERM (the supervisor stops its driver), then SIGKILL if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


@pytest.fixture
def start_supervisor(gkd_home):
    started: list[RunningSupervisor] = []

    def start(*args: str, step_s: float = 0.05, driver: str = "gkd_core.demo_driver", **env_extra: str):
        """A supervisor; by default with the light demo driver (the trainer's own tests pass
        ``driver="gkd_core.trainer.driver"``)."""
        env = dict(os.environ, GKD_HOME=str(gkd_home), GKD_DEMO_STEP_S=str(step_s), **env_extra)
        sup = RunningSupervisor(gkd_home, [*args, "--driver", driver], env)
        started.append(sup)
        return sup

    yield start
    for sup in started:
        sup.kill()


def needs(module: str, require_env: str, venv: str) -> None:
    """Skip the calling test module where ``module`` does not import, unless ``require_env`` is 1 (CI, in
    the venv made for it), under which its absence fails instead of passing unseen."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as e:
        if os.environ.get(require_env) == "1":
            raise RuntimeError(f"{require_env}=1 but {module} does not import here: {e}") from e
        pytest.skip(f"{module} is not installed here (CI runs these in {venv})", allow_module_level=True)


def nvml_library_loads() -> bool:
    """Whether this machine has NVML at all, asked of the dynamic loader rather than of our code: what
    a test of the GPU probes expects follows from it (a reading, or the exact note of no driver)."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def logged_events(run: Path) -> list[dict]:
    """The events of a run's log, whole lines only: its supervisor may be halfway through writing the last."""
    import json

    lines = (run / "events.jsonl").read_text().split("\n")[:-1]
    return [json.loads(line) for line in lines if line.strip()]


def wait_until(pred, timeout_s: float, what: str, every_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what} (last: {str(value)[:2000]})")


def gkd_tui(*args: str, env: dict | None = None, home: Path | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess:
    """The command line, as a user runs it, from the repository's root (``home``: its GKD_HOME)."""
    if home is not None:
        env = dict(env if env is not None else os.environ, GKD_HOME=str(home))
    return subprocess.run([sys.executable, "-m", "gkd_tui.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=env)


def status_json(run: Path) -> dict | None:
    """`gkd-tui status --json` of ``run``, or None when it does not answer."""
    import json

    got = gkd_tui("status", str(run), "--json", timeout=10)
    return json.loads(got.stdout) if got.returncode == 0 else None


def read_until(proc: subprocess.Popen, text: str, max_lines: int = 500) -> None:
    """Read a process's output until a line holds ``text`` (its output says what it got to instead)."""
    seen: list[str] = []
    while not any(text in line for line in seen) and proc.poll() is None and len(seen) < max_lines:
        seen.append(proc.stdout.readline())
    assert any(text in line for line in seen), "".join(seen)


def opted_in(argv: list[str], environ: dict[str, str], **extra: str) -> tuple[subprocess.Popen, Path]:
    """A job its user started with ``GKD_WATCH=1`` (none of a run's variables), and the run it started for
    itself once its supervisor made it; the job in a session of its own, its output piped."""
    env = {k: v for k, v in environ.items() if not k.startswith("GKD_") or k == "GKD_HOME"}
    env.update(GKD_WATCH="1", **extra)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    home = rundir.gkd_home()
    try:
        run = wait_until(lambda: rundir.resolve_run(None) if (home / "runs" / "latest").exists() else None, 60,
                         "the job's own run", every_s=0.2)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        raise
    return proc, run


def attach_plain(env: dict[str, str]) -> str:
    """What ``gkd-tui attach --ray-address auto --plain`` prints of the Ray cluster, with no run."""
    got = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "attach", "--ray-address", "auto", "--plain"],
                         capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    return got.stdout


class Posted(NamedTuple):
    """A POST a ``webhook`` received: when, its JSON body, and its Authorization header."""

    ts: float
    body: dict
    authorization: str | None


@pytest.fixture
def webhook():
    """A real webhook receiver on 127.0.0.1: ``(base URL, the POSTs it got)``; it answers 200 to each."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    got: list[Posted] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            got.append(Posted(time.time(), body, self.headers.get("Authorization")))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):  # (quiet: pytest shows what a test says)
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", got
    server.shutdown()
    server.server_close()
