"""The chaos suite: every component of a real run frozen (SIGSTOP, then SIGCONT) and killed
(SIGKILL) at a random step, and what follows measured.

One run per component: first the freeze (the run must come back by itself), then the kill (the
run recovers by itself, or ``gkd-tui restart`` resumes it from the latest checkpoint). For each
fault: how many seconds until the supervisor (or ``gkd-tui status``) says it, how the run came
back and from which step, how many completed steps were lost; then ``events.jsonl`` is checked
line by line, ``gkd-tui stop`` ends the run, and no process of the run may be left.

The rows make the table in tests/chaos/CHAOS.md: ``GKD_CHAOS_TABLE=tests/chaos/CHAOS.md python -m pytest
tests/chaos/test_chaos.py`` writes it.
"""

from __future__ import annotations

import json
import os
import pty
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, wait_until
from gkd_core import rundir

pytestmark = pytest.mark.slow
TRAINER = "gkd_core.trainer.driver"
# a real run of the embedded demo; a checkpoint every step, so that a restart can lose no completed
# step, and a teacher timeout a test can wait out (the default is 30 s, three times)
SETTINGS = ("trainer.total_steps=100000", "trainer.checkpoint_every=1", "trainer.keep_checkpoints=2",
            "teacher.request_timeout_s=5", "teacher.max_retries=1")
FREEZE_S = 8.0  # how long a SIGSTOPped process stays frozen: past the 5 s that names a frozen worker
SAY_S = 60.0  # a fault not said within this fails the test


@dataclass
class Row:
    component: str
    fault: str
    at_step: int
    said: str  # what said it, and after how many seconds
    outcome: str  # recovered by itself / restarted from step N
    lost: int  # completed steps lost
    log_ok: bool


ROWS: list[Row] = []


@pytest.fixture(scope="module", autouse=True)
def chaos_table():
    yield
    table = render(ROWS)
    print("\n" + table)
    target = os.environ.get("GKD_CHAOS_TABLE")
    if target and ROWS:
        head = Path(target).read_text().split("<!-- table -->")[0] if Path(target).exists() else ""
        Path(target).write_text(head + "<!-- table -->\n" + table + "\n")


def render(rows: list[Row]) -> str:
    lines = ["| component | fault | at step | said by, after | recovery | steps lost | log intact |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.component} | {r.fault} | {r.at_step} | {r.said} | {r.outcome} | {r.lost} | "
                     f"{'yes' if r.log_ok else '**no**'} |")
    return "\n".join(lines)


# --- the run ------------------------------------------------------------------------------

class Chaos:
    """A run under test, and the ways to look at it from outside (the event log, the CLI)."""

    def __init__(self, sup, home: Path):
        self.sup, self.home = sup, home
        self.run = sup.run

    def events(self) -> list[dict]:
        out = []
        for line in (self.run / "events.jsonl").read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass  # a torn last line while it is written; intact() checks the whole log
        return out

    def step(self) -> int:
        return max((e["step"] for e in self.events() if e["kind"] == "metrics"), default=0)

    def pid(self, src: str) -> int:
        if src == "supervisor":
            return rundir.read_endpoints(self.run)["supervisor_pid"]
        regs = [e for e in self.events() if e["kind"] == "worker" and e["src"].startswith(src)]
        assert regs, f"{src} never registered"
        return regs[-1]["pid"]

    def gkd(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        env = dict(os.environ, GKD_HOME=str(self.home))
        return subprocess.run([sys.executable, "-m", "gkd_tui.cli", *args], env=env, cwd=ROOT, text=True,
                              capture_output=True, timeout=timeout_s)

    def wait_step(self, beyond: int, timeout_s: float, what: str) -> int:
        return wait_until(lambda: self.step() if self.step() > beyond else 0, timeout_s, what, every_s=0.2)

    def said_since(self, t0: float, src: str) -> str:
        """The first thing the run said about ``src`` after ``t0`` (wall clock), or ""."""
        for e in self.events():
            if e["ts"] < t0:
                continue
            if e["kind"] == "alert" and not e.get("cleared") and (
                    src in " ".join(e.get("targets") or []) or src in e.get("message", "")):
                return f"alert {e['code']}, {e['ts'] - t0:.1f} s"
            if e["kind"] == "log" and e.get("level") in ("warn", "error") and src in e["message"]:
                return f"the {e['src']}'s {e['level']} log line, {e['ts'] - t0:.1f} s"
            if e["kind"] == "run" and e["state"] in ("failed", "restarting"):
                return f"run {e['state']}, {e['ts'] - t0:.1f} s"
        return ""

    def intact(self) -> bool:
        """Every line of events.jsonl is a JSON object and ``seq`` strictly increases."""
        data = (self.run / "events.jsonl").read_bytes()
        # a live log: the writer flushes its 64 KiB buffer where it fills, so the tail may be a line
        # it has not finished yet; every line before the last newline must be whole
        data = data[:data.rfind(b"\n") + 1]
        last = 0
        for n, line in enumerate(data.splitlines(), 1):
            e = json.loads(line)  # raises, with the line, if it is not JSON
            assert e["seq"] > last, f"events.jsonl line {n}: seq {e['seq']} after {last}"
            last = e["seq"]
        return True

    def resumed_from(self, since_seq: int) -> int:
        logs = [e for e in self.events() if e["seq"] > since_seq and e["kind"] == "log"
                and e["message"].startswith("resumed from")]
        return int(logs[0]["message"].split("(step ")[1].split(",")[0].rstrip(")")) if logs else 0

    def processes(self) -> list[str]:
        """Every live process of this run: its supervisors (``--run-id RUN`` or ``--resume …/RUN``
        on their command line), and whatever carries its run id in its environment (the driver,
        Ray's processes it started, every Ray worker)."""
        found, run_id = [], self.run.name.encode()
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                env = (d / "environ").read_bytes()
                stat = (d / "stat").read_text()
                cmdline = (d / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue  # gone meanwhile, or not ours to read
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue  # a zombie holds nothing; its parent's wait reaps it
            if b"GKD_RUN_ID=" + run_id in env.split(b"\0") or (b"gkd_core" in cmdline and run_id in cmdline):
                found.append(f"{d.name} {cmdline[:80].decode(errors='replace')}")
        return found

    def wait_ended(self, timeout_s: float, what: str) -> None:
        """Until no process of the run is left; else fail, naming those that are."""
        deadline = time.monotonic() + timeout_s
        while left := self.processes():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; still running: {left}")
            time.sleep(0.5)

    def kill_all(self) -> None:
        for line in self.processes():
            try:
                os.kill(int(line.split()[0]), signal.SIGKILL)
            except ProcessLookupError:
                pass


class Dashboard:
    """``gkd-tui attach`` in a pseudo-terminal, as a person over SSH would have it."""

    def __init__(self, run: Path, home: Path):
        self.master, slave = pty.openpty()
        env = dict(os.environ, GKD_HOME=str(home), TERM="xterm-256color", COLUMNS="120", LINES="40")
        self.proc = subprocess.Popen([sys.executable, "-m", "gkd_tui.cli", "attach", str(run)], stdin=slave,
                                     stdout=slave, stderr=slave, env=env, cwd=ROOT, start_new_session=True)
        os.close(slave)
        os.set_blocking(self.master, False)

    def drain(self) -> int:
        """Read what it drew (a terminal that is not read fills up and blocks the app)."""
        n = 0
        try:
            while chunk := os.read(self.master, 1 << 16):
                n += len(chunk)
        except (BlockingIOError, OSError):
            pass
        return n

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


COMPONENTS = ["supervisor", "driver", "student/0", "rollout/0", "teacher/proxy", "teacher/0", "agent/",
              "dashboard"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_freeze_then_kill(component, start_supervisor, gkd_home):
    rng = random.Random(f"chaos {component}")  # a fixed seed: the same random steps in every CI run
    sup = start_supervisor(*SETTINGS, "--linger", "300", driver=TRAINER)
    chaos = Chaos(sup, gkd_home)
    dash = Dashboard(sup.run, gkd_home) if component == "dashboard" else None
    name = component.rstrip("/") if component != "agent/" else "node agent"
    try:
        # -- SIGSTOP, hold, SIGCONT: the run must come back by itself ----------------------
        at = chaos.wait_step(rng.randint(3, 8) - 1, 240, "the step to freeze at")
        target = dash.proc.pid if dash else chaos.pid(component)
        t0 = time.time()
        os.kill(target, signal.SIGSTOP)
        said = observe(chaos, component, t0, dash)
        time.sleep(max(0.0, FREEZE_S - (time.time() - t0)))
        os.kill(target, signal.SIGCONT)
        stopped_at = chaos.step()
        chaos.wait_step(stopped_at + 2, 120, f"training to go on after {component} thawed")
        if dash:
            assert dash.proc.poll() is None, "the dashboard died of being frozen"
        ROWS.append(Row(name, "SIGSTOP 8 s, SIGCONT", at, said, "recovered by itself", 0, chaos.intact()))

        # -- SIGKILL: recovered by itself, or `gkd-tui restart` from the latest checkpoint ------
        at = chaos.wait_step(chaos.step() + rng.randint(1, 4) - 1, 120, "the step to kill at")
        target = dash.proc.pid if dash else chaos.pid(component)
        seq0 = chaos.events()[-1]["seq"]
        t0 = time.time()
        os.kill(target, signal.SIGKILL)
        said = observe(chaos, component, t0, dash)
        done_before = chaos.step()
        outcome, lost = recover(chaos, component, done_before, seq0, target)
        ROWS.append(Row(name, "SIGKILL", at, said, outcome, lost, chaos.intact()))
        assert lost == 0
        if dash:
            dash.drain()
    except BaseException:
        chaos.kill_all()  # a supervisor that took the run over is not the fixture's to clean up
        raise
    finally:
        if dash:
            dash.close()
    # -- the end: `gkd-tui stop` leaves nothing behind --------------------------------------
    out = chaos.gkd("stop", str(sup.run))
    assert out.returncode == 0, out.stderr
    chaos.wait_ended(60, "every process of the run to end")
    assert chaos.intact()


def observe(chaos: Chaos, component: str, t0: float, dash: Dashboard | None) -> str:
    """What says the fault, and after how many seconds."""
    if dash is not None:
        # a viewer is not part of the run: nothing to say; the run must not feel it
        step = chaos.step()
        chaos.wait_step(step + 2, 60, "training to go on while the dashboard is frozen or gone")
        with chaos.sup.client(timeout_s=2.0) as c:
            assert c.request("ping") is not None
        return "nothing to say: the run goes on"
    if component == "supervisor":
        def unreachable():
            out = chaos.gkd("status", str(chaos.run), timeout_s=30)
            return out if out.returncode != 0 else None
        out = wait_until(unreachable, SAY_S, "gkd-tui status to say the supervisor does not answer")
        took = time.time() - t0
        if "is gone: `gkd-tui restart" in out.stderr:
            return f"`gkd-tui status`: the supervisor is gone, `restart` takes over; {took:.1f} s"
        assert "no answer" in out.stderr, out.stderr
        return f"`gkd-tui status`: no answer from the supervisor; {took:.1f} s"
    said = wait_until(lambda: chaos.said_since(t0, component.rstrip("/")), SAY_S,
                      f"the run to say {component} is frozen or gone", every_s=0.2)
    return said


def recover(chaos: Chaos, component: str, done_before: int, seq0: int, killed: int) -> tuple[str, int]:
    """(how the run came back, completed steps lost)."""
    t0 = time.time()
    if component in ("teacher/proxy", "teacher/0", "agent/"):
        # started again by the driver: a new process registers under the same name
        wait_until(lambda: chaos.pid(component) != killed, 120, f"{component} to be started again", every_s=0.3)
        # named as dead by the driver that started it again (its new self registers before a silence could)
        said = [e for e in chaos.events() if e["seq"] > seq0 and e["kind"] == "alert"
                and e["code"] == "restarted_by_driver" and any(t.startswith(component) for t in e["targets"])]
        assert said and not said[0].get("cleared"), said
        chaos.wait_step(done_before + 2, 120, f"training to go on after {component} was started again")
        return f"started again by the driver, {time.time() - t0:.0f} s", 0

    def moving_or_failed():
        states = [e for e in chaos.events() if e["seq"] > seq0 and e["kind"] == "run"]
        if states and states[-1]["state"] in ("failed", "stopped"):
            return "failed"
        return "moving" if chaos.step() >= done_before + 2 else None

    if component != "supervisor":
        how = wait_until(moving_or_failed, 180, f"the run to go on or fail after {component} was killed",
                         every_s=0.3)
        if how == "moving":
            return "recovered by itself", 0
    else:
        # Ray's agents (dashboard, runtime env) whose raylet died without a SIGTERM try for 60 s to tell the
        # control store, gone with it, before they exit (ray/_private/process_watcher.py: publish_error, 60)
        chaos.wait_ended(90, "the driver and its Ray to end with the supervisor")
    seq1 = chaos.events()[-1]["seq"]
    out = chaos.gkd("restart", str(chaos.run))
    assert out.returncode == 0, out.stderr + out.stdout
    resumed = wait_until(lambda: chaos.resumed_from(seq1), 180, "the restarted driver to resume", every_s=0.3)
    chaos.wait_step(resumed + 1, 180, "training to go on after the restart")
    return f"`gkd-tui restart`: from step {resumed}, {time.time() - t0:.0f} s", max(0, done_before - resumed)
