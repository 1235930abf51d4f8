"""The chaos suite: every component of a real run frozen (SIGSTOP, then SIGCONT) and killed
(SIGKILL) at a random step, and what follows measured.

A real run for each component, with the shipped checkpoint interval (the components whose kill the run
recovers from by itself share one, ``SHARED``): first the freeze (the run must come
back by itself), then the kill (the run recovers by itself, or ``gkd-tui restart`` resumes it from
the latest checkpoint). The steps to fault at are drawn from a seed that is printed (``GKD_CHAOS_SEED``
draws them again). For each fault: how many seconds until the supervisor (or ``gkd-tui status``)
says it, how the run came back and from which step, how many completed steps were lost (read from
the log: the steps done before the fault and trained again after it); then ``events.jsonl`` is
checked against the steps run, ``gkd-tui stop`` ends the run, and no process of the run may be left.

The rows make tests/chaos/CHAOS.md: ``GKD_CHAOS_TABLE=tests/chaos/CHAOS.md python -m pytest
tests/chaos/test_chaos.py`` writes it whole (``HEAD`` below, then the table).
"""

from __future__ import annotations

import json
import os
import pty
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from chaos_naming import first_naming
from conftest import ROOT, RunningSupervisor, wait_until

from gkd_core import rundir
from gkd_core.config import load_config
from gkd_core.diagnosis.rules.workers import SLOW_ON_PURPOSE
from gkd_core.node.cpu_load import NODE_BUSY
from gkd_core.supervisor.drivers import LOST_STEPS

pytestmark = pytest.mark.slow
TRAINER = "gkd_core.trainer.driver"
# a real run of the embedded demo with the shipped checkpoint interval, and a teacher timeout a test can
# wait out (the default is 30 s, three times)
SETTINGS = ("trainer.total_steps=100000", "teacher.request_timeout_s=5", "teacher.max_retries=1")
CHECKPOINT_EVERY = load_config(None).trainer.checkpoint_every  # a restart loses fewer steps than this
# the steps to fault at, drawn anew each run from this seed (printed with the table; set it to draw them again)
SEED = int(os.environ.get("GKD_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
FREEZE_S = 8.0  # how long a SIGSTOPped process stays frozen: past the 5 s that names a frozen worker
SAY_S = 60.0  # a fault not said within this fails the test
NAME_WITHIN_S = 10.0  # the first critical alert after a fault names the process hit within this, but:
# a worker frozen in a phase slow on purpose (a checkpoint's pickling may hold the GIL), or on a node whose
# CPU is held outside the run (node_busy), is warned at 5 s and critical only at the heartbeat's stall
# limit, counted from its last beat (up to one before the freeze) and judged twice a second
SLOW_FROZEN_WITHIN_S = load_config(None).telemetry.stall_s + 2.0
QUIET_S = 8.0  # longer than any rule takes to say a fault (5 s): a late finding is not the next fault's
# bench/chaos_trials.py writes its table between these in CHAOS.md; the suite, writing the file whole, keeps it
RANDOM_TRIALS = ("<!-- random trials -->", "<!-- /random trials -->")


@dataclass
class Row:
    component: str
    fault: str
    at_step: int
    said: str  # what said it, and after how many seconds
    outcome: str  # recovered by itself / restarted from step N
    lost: int | str  # completed steps lost: done before the fault, trained again after it (from the log)
    log: str  # "yes", or what is wrong with events.jsonl


ROWS: list[Row] = []


HEAD = """# The chaos suite

Written by `tests/chaos/test_chaos.py` (`GKD_CHAOS_TABLE=tests/chaos/CHAOS.md python -m pytest
tests/chaos/test_chaos.py`), which runs in CI with the rest of the suite. Two real runs: one for the
supervisor, whose kill ends its run's supervisor, and one the other components share in the table's
order, each once the findings of the one before have settled (a run that `gkd-tui restart` brought back,
or that came back by itself, is the next component's run). Each is
the embedded CPU demo on a local Ray cluster, driven by the real trainer, with the shipped settings
but for the teacher's timeout (`teacher.request_timeout_s=5`, `teacher.max_retries=1`, so that a test
can wait a teacher out; the default is 30 s, three times). Each component is first frozen, then
killed, at steps drawn from a seed printed with the table:

- **Frozen**: `SIGSTOP`, held for 8 s, then `SIGCONT`. The run must come back by itself, losing no step.
- **Killed**: `SIGKILL`. The run must recover by itself, or `gkd-tui restart` must resume it from
  the latest checkpoint (one every {every} steps, the default): the steps after it are trained
  again, so fewer than {every} are lost.

"said by, after": what names the fault and how many seconds after it: the first critical alert (or
the driver's word that it started the process again, `restarted_by_driver`), which must have the process
hit in its targets, not only in its message, within 10 s; a worker frozen in a phase slow on purpose
(a checkpoint, whose pickling may hold the GIL) or on a node whose agent says its CPU is held outside
the run, within 12 s (it is warned at 5 s while its peers' heartbeats come, critical at
`telemetry.stall_s`, 10 s, from its last beat); "(diagnosis)" when a rule inferred it, "(driver)" when
it is the driver's own report. For the supervisor, `gkd-tui status` says it. "steps lost": read from
`events.jsonl`, the steps completed before the fault that were trained again after it. "log intact":
every line of `events.jsonl` is a JSON object, `seq` strictly
increases, and the steps it records are the steps run: from 1 up with none missing, and a step
twice only where a resume trained it again. Then `gkd-tui stop`, and no process of the run may be
left: the supervisor, and every process with the run's id in its environment (the driver, Ray's
processes it started, every Ray worker).

The random trials (`bench/chaos_trials.py`) are at the end of this file: a fault matrix of signals, a
rank that never joins the sync's broadcast, a hang inside the sync, memory growing to the OOM killer in a
cgroup, a teacher that answers errors, a worker three times slower than its peer, and a deadlock between
a Ray job's actors, each at random moments: is the right process named first, how soon, and how often
is a process named when no fault was made.

## What a killed supervisor does to the training, and why

The driver is the supervisor's child, and it asks the kernel for `SIGTERM` when its parent dies
(`PR_SET_PDEATHSIG`, `gkd_core/lifeline.py`), and passes it to its process group, where the Ray
cluster its `ray.init` started lives (as `gkd-tui stop` signals the group). So a killed supervisor
ends the driver and its Ray within seconds; Ray's workers end with their raylet. Nothing is left
running. `gkd-tui status` says at once that the supervisor is gone, and what to do next:

```
gkd-tui: its supervisor (pid N) is gone: `gkd-tui restart RUN` takes the run over and resumes it from its \
latest checkpoint
```

`gkd-tui restart RUN` then starts a new supervisor on the same run directory. The new supervisor:

- continues `events.jsonl` where it stopped. A line torn by the kill is set aside in
  `events.jsonl.torn`, so the log stays one JSON object per line.
- takes `seq` and the run's state from the log;
- writes the next `restarts/NNN.yaml`;
- starts the driver, which resumes from the latest checkpoint.

A supervisor killed while it is behind (just thawed from a freeze, with seconds of events still
queued) takes the events it had not written with it: steps that were trained, and that the newest
checkpoint may hold, never reach the log. The supervisor taking over compares the two and says so
in the log, as a warning the dashboard shows (`the log lost steps 71-109: checkpoint step_000110
holds step 110, and the log has steps only to 70; ...`), rather than leaving a silent hole in the
steps (the checkpoint's own step is said again by the driver that resumes from it). The table then
counts the steps lost as unknown: those the killed driver trained after that checkpoint went with the
events.

This is the right design because a run that nobody records is a run nobody can diagnose. Its
phases, heartbeats and syncs would go nowhere. The dashboard could not name a straggler, and
`stop` could not reach it. Letting such a run keep the GPUs is worse than stopping it at a
checkpoint and resuming it with the record whole: {supervisor_back} in the table below.

A frozen supervisor is different: the training does not wait for it. Workers push their events
over ZeroMQ, and those queue until the supervisor is thawed; then the log catches up. Each
process queues up to 10,000 events; beyond that it drops them and counts the drops in its
heartbeat's `dropped`. Meanwhile
`gkd-tui status` says the supervisor does not answer.

## The table
"""


@pytest.fixture(scope="module", autouse=True)
def chaos_table(request):
    yield
    table = render(ROWS)
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and ROWS:  # in the run's own output, passed or failed
        with capture.global_and_fixture_disabled():  # (a fixture's teardown output is captured otherwise)
            reporter.write_line("\n" + table)
    target = os.environ.get("GKD_CHAOS_TABLE")
    if target and ROWS:
        path = Path(target)
        old = path.read_text() if path.exists() else ""
        head, found, rest = old.partition(RANDOM_TRIALS[0])
        trials = (f"\n## Random trials\n\n{found}{rest.partition(RANDOM_TRIALS[1])[0]}{RANDOM_TRIALS[1]}\n"
                  if found else "")
        path.write_text(head_text(ROWS) + "\n" + table + "\n" + trials)


def head_text(rows: list[Row]) -> str:
    """HEAD, its numbers from the table: how long the run took to train again after its supervisor was killed."""
    back = [m[1] for r in rows if r.component == "supervisor" and r.fault == "SIGKILL"
            and (m := re.search(r", (\d+) s$", r.outcome))]
    return HEAD.format(every=CHECKPOINT_EVERY, supervisor_back=f"{back[0]} s" if back else "not measured in this run")


def render(rows: list[Row]) -> str:
    lines = [f"Seed {SEED} (`GKD_CHAOS_SEED={SEED}` draws the same steps again).", "",
             "| component | fault | at step | said by, after | recovery | steps lost | log intact |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.component} | {r.fault} | {r.at_step} | {r.said} | {r.outcome} | {r.lost} | "
                     f"{r.log if r.log.startswith('yes') else '**no**: ' + r.log} |")
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

    def phase_at(self, src: str, t0: float) -> str:
        """The phase ``src`` (a name ending in a slash: the first of that role) said last before ``t0``."""
        return next((e["phase"] for e in reversed(self.events()) if e["kind"] == "phase" and e["ts"] <= t0
                     and (e["src"] == src or (src.endswith("/") and e["src"].startswith(src)))), "")

    def node_busy_between(self, t0: float, t1: float) -> bool:
        """A node agent said its node's CPU was held outside the run at some moment of ``[t0, t1]``."""
        at_t0: dict[str, str] = {}  # each agent's phase when the window opened
        for e in self.events():
            if e["kind"] != "phase" or not e["src"].startswith("agent/") or e["ts"] > t1:
                continue
            if e["ts"] < t0:
                at_t0[e["src"]] = e["phase"]
            elif e["phase"] == NODE_BUSY:
                return True
        return NODE_BUSY in at_t0.values()

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

    def named_now(self) -> list[str]:
        """The alerts that name a worker and hold now (not cleared)."""
        active: dict[tuple, str] = {}
        for e in self.events():
            if e["kind"] == "alert" and e.get("targets"):
                key = (e["code"], tuple(e["targets"]))
                if e.get("cleared"):
                    active.pop(key, None)
                else:
                    active[key] = f"{e['code']} {', '.join(e['targets'])}"
        return sorted(active.values())

    def quiet(self, for_s: float = QUIET_S) -> None:
        """Until no alert names a worker, for ``for_s``: the last fault's findings (some come seconds late) and a
        restart's (workers still starting) must not be taken for the next one's."""
        since = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.named_now():
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= for_s:
                return
            time.sleep(0.3)
        raise TimeoutError(f"the run did not settle within 180 s: {self.named_now()}")

    def wait_step(self, beyond: int, timeout_s: float, what: str) -> int:
        return wait_until(lambda: self.step() if self.step() > beyond else 0, timeout_s, what, every_s=0.2)

    def named(self, t0: float, src: str, within_s: float = NAME_WITHIN_S) -> str:
        """The first naming of the fault (chaos_naming: a critical alert, or the driver's word that it started
        ``src`` again) after ``t0``, as the table says it; "" while there is none. AssertionError when it
        names another process (one that only mentions ``src`` in its message included) or comes too late."""
        naming = first_naming(self.events(), t0, src)
        if naming is None:
            return ""
        said = f"alert {naming.code} ({naming.by}), {naming.after_s:.1f} s"
        assert naming.right, (f"the first critical alert after the fault on {src} named {', '.join(naming.targets)}: "
                              f"{naming.code}: {naming.message[:200]} (seed {SEED})")
        assert naming.after_s <= within_s, f"{src} named only after {naming.after_s} s: {said} (seed {SEED})"
        return said

    def where(self) -> tuple[int, int]:
        """(the newest step completed, the newest seq): where the run stands now."""
        evs = self.events()
        return max((e["step"] for e in evs if e["kind"] == "metrics"), default=0), (evs[-1]["seq"] if evs else 0)

    def lost(self, done: int, seq: int) -> int:
        """How many of the steps completed by ``seq`` (the newest ``done``) were trained again after it (where
        no driver started since: a restart's are counted from its checkpoint, ``after_restart``)."""
        after = [e["step"] for e in self.events() if e["seq"] > seq and e["kind"] == "metrics"]
        assert after, f"no step completed after seq {seq}"
        return max(0, done - (after[0] - 1))

    def log_problems(self) -> str:
        """What is wrong with events.jsonl, or "": every line a JSON object, ``seq`` strictly increasing, and
        the steps recorded the steps run: from 1 up with none missing, each once but where a resume trains it again."""
        data = (self.run / "events.jsonl").read_bytes()
        # a live log: the writer flushes its 64 KiB buffer where it fills, so the tail may be a line
        # it has not finished yet; every line before the last newline must be whole
        data = data[:data.rfind(b"\n") + 1]
        last, steps, resumed = 0, [], None
        for n, line in enumerate(data.splitlines(), 1):
            try:
                e = json.loads(line)
            except ValueError:
                return f"line {n} is not JSON: {line[:80]!r}"
            if not isinstance(e, dict) or not isinstance(e.get("seq"), int) or e["seq"] <= last:
                return f"line {n}: seq {e.get('seq') if isinstance(e, dict) else '?'} after {last}"
            last = e["seq"]
            if e.get("kind") == "log" and e.get("message", "").startswith("resumed from"):
                resumed = int(e["message"].split("(step ")[1].split(",")[0].rstrip(")"))
            elif gap := lost_span(e):  # steps the log says it lost (a supervisor killed while behind)
                if gap[0] != (steps[-1] if steps else 0) + 1:
                    return (f"line {n}: the log says it lost steps {gap[0]}-{gap[1]}, "
                            f"after step {steps[-1] if steps else 0}")
                steps.extend(range(gap[0], gap[1] + 1))
            elif e.get("kind") == "run" and e.get("state") in ("starting", "restarting", "running"):
                resumed = 0  # a driver (started again): until a resume says otherwise, from step 1
            elif e.get("kind") == "metrics":
                step, prev = e["step"], steps[-1] if steps else 0
                if resumed and step == resumed:  # the checkpoint's metrics, said again by the driver resuming
                    if step == prev + 1:
                        steps.append(step)  # ... which the driver before it died before saying
                    continue
                if resumed and resumed > prev:
                    return f"line {n}: a resume from step {resumed}, but the log has steps only to {prev}"
                # a driver just started trains the step after its checkpoint's (1 without one); else the next
                expected = prev + 1 if resumed is None else resumed + 1
                if step != expected:
                    return f"line {n}: step {step} after step {prev}" + (
                        f" (after a resume from step {resumed}, {resumed + 1} is next)" if resumed is not None else "")
                steps.append(step)
                resumed = None
        return ""

    def gaps(self) -> str:
        """The steps the log says it lost, as it says them ("71-109"), or ""."""
        spans = [lost_span(e) for e in self.events()]
        return ", ".join(f"{a}-{b}" if a < b else str(a) for a, b in filter(None, spans))

    def after_restart(self, seq: int) -> tuple[int, list[int]]:
        """From one read of the log: the checkpoint's step a driver started after ``seq`` resumed from (0:
        none, from the start), and the steps trained since (not that checkpoint's own, said again)."""
        evs = [e for e in self.events() if e["seq"] > seq]
        said = [e["message"] for e in evs if e["kind"] == "log" and e["message"].startswith("resumed from")]
        resumed = int(said[0].split("(step ")[1].split(",")[0].rstrip(")")) if said else 0
        return resumed, [e["step"] for e in evs if e["kind"] == "metrics" and not (resumed and e["step"] == resumed)]

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


def lost_span(e: dict) -> tuple[int, int] | None:
    """(first, last) of the steps a take-over says the log lost ("the log lost steps 71-109: ..."), else None."""
    said = LOST_STEPS.match(e.get("message", "")) if e.get("kind") == "log" else None
    return (int(said[1]), int(said[2] or said[1])) if said else None


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


COMPONENTS = ["supervisor", "driver", "student/0", "rollout/0", "dashboard", "agent/", "teacher/0",
              "teacher/proxy"]
# Every component but the supervisor leaves a run the next component's faults can be made in: the run
# came back by itself, or `gkd-tui restart` started every process anew under the same supervisor. These
# share one run (a run's start is most of a test's time), each after the last one's findings have settled
# (``quiet``). The proxy is the last: a new proxy counts its requests from zero, and its client's count
# goes on. The supervisor's kill ends its run's supervisor: a run of its own.
SHARED = ("driver", "student/0", "rollout/0", "dashboard", "agent/", "teacher/0", "teacher/proxy")


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory, teacher_cache):
    """The run of the SHARED components, started by the first that asks; started again after a test that
    failed in it (whose run was killed). The last component stops it, as every other test stops its own."""
    home = tmp_path_factory.mktemp("chaos-shared") / "gkd"
    home.mkdir()
    (home / "cache").symlink_to(teacher_cache)
    runs: list[RunningSupervisor] = []

    def live() -> RunningSupervisor:
        if not runs or runs[-1].proc.poll() is not None:
            env = dict(os.environ, GKD_HOME=str(home))
            runs.append(RunningSupervisor(home, [*SETTINGS, "--linger", "300", "--driver", TRAINER], env))
        return runs[-1]

    yield live, home
    for sup in runs:
        sup.kill()


@pytest.mark.parametrize("component", COMPONENTS)
def test_freeze_then_kill(component, request, gkd_home):
    rng = random.Random(f"{SEED} {component}")  # the run's seed (printed with the table), then the component
    if component in SHARED:
        live, home = request.getfixturevalue("shared_run")
        sup = live()
        chaos = Chaos(sup, home)
        chaos.wait_step(0, 240, "the run's first step")
        chaos.quiet()  # the faults of the component before, said and settled
    else:
        sup = request.getfixturevalue("start_supervisor")(*SETTINGS, "--linger", "300", driver=TRAINER)
        chaos = Chaos(sup, gkd_home)
    dash = Dashboard(sup.run, chaos.home) if component == "dashboard" else None
    name = component.rstrip("/") if component != "agent/" else "node agent"
    try:
        # -- SIGSTOP, hold, SIGCONT: the run must come back by itself ----------------------
        chaos.wait_step(chaos.step() + rng.randint(3, 8) - 1, 240, "the step to freeze at")
        target = dash.proc.pid if dash else chaos.pid(component)
        at = chaos.step()  # the table's "at step": the newest done as the signal goes (the run moved on meanwhile)
        t0 = time.time()
        os.kill(target, signal.SIGSTOP)
        said = observe(chaos, component, t0, dash, within_s=SLOW_FROZEN_WITHIN_S)
        if not dash and component != "supervisor":
            naming = first_naming(chaos.events(), t0, component)
            # within 10 s, unless the product says why it waits for the stall limit: a phase slow on purpose,
            # or its node's CPU held outside the run (this test's own polling of the log can count there)
            excused = (chaos.phase_at(component, t0) in SLOW_ON_PURPOSE
                       or chaos.node_busy_between(t0, t0 + naming.after_s))
            assert excused or naming.after_s <= NAME_WITHIN_S, f"{component} named only after {said} (seed {SEED})"
        time.sleep(max(0.0, FREEZE_S - (time.time() - t0)))
        stopped_at, seq = chaos.where()
        os.kill(target, signal.SIGCONT)
        chaos.wait_step(stopped_at + 2, 120, f"training to go on after {component} thawed")
        if dash:
            assert dash.proc.poll() is None, "the dashboard died of being frozen"
        lost = chaos.lost(stopped_at, seq)
        ROWS.append(Row(name, "SIGSTOP 8 s, SIGCONT", at, said, "recovered by itself", lost,
                        chaos.log_problems() or "yes"))
        assert lost == 0, f"a freeze that the run came back from by itself lost {lost} step(s) (seed {SEED})"

        # -- SIGKILL: recovered by itself, or `gkd-tui restart` from the latest checkpoint ------
        chaos.wait_step(chaos.step() + rng.randint(1, 4) - 1, 120, "the step to kill at")
        target = dash.proc.pid if dash else chaos.pid(component)
        at, seq0 = chaos.where()
        t0 = time.time()
        os.kill(target, signal.SIGKILL)
        said = observe(chaos, component, t0, dash, within_s=NAME_WITHIN_S)
        done_before, seq = chaos.where()
        outcome, lost = recover(chaos, component, done_before, seq, seq0, target, t0)
        log, gaps = chaos.log_problems(), chaos.gaps()
        if gaps:  # the driver's last steps went with the events: how many it trained after the checkpoint is unknown
            lost = f"unknown, under {CHECKPOINT_EVERY}"
        ROWS.append(Row(name, "SIGKILL", at, said, outcome, lost,
                        log or ("yes" if not gaps
                                else f"yes; it says it lost steps {gaps} (the supervisor was behind)")))
        assert not log, f"events.jsonl: {log} (seed {SEED})"
        if dash:
            dash.drain()
    except BaseException:
        chaos.kill_all()  # a supervisor that took the run over is not the fixture's to clean up
        raise
    finally:
        if dash:
            dash.close()
    # -- the end: `gkd-tui stop` leaves nothing behind --------------------------------------
    if component in SHARED and component != SHARED[-1]:
        return  # the next component's faults are made in this run
    out = chaos.gkd("stop", str(sup.run))
    assert out.returncode == 0, out.stderr
    chaos.wait_ended(60, "every process of the run to end")
    assert not chaos.log_problems()


def observe(chaos: Chaos, component: str, t0: float, dash: Dashboard | None, within_s: float) -> str:
    """What says the fault, and after how many seconds: the process hit named within ``within_s``."""
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
    return wait_until(lambda: chaos.named(t0, component, within_s), SAY_S,
                      f"the run to name {component}, frozen or gone", every_s=0.2)


def recover(chaos: Chaos, component: str, done_before: int, seq: int, seq0: int, killed: int,
            t0: float) -> tuple[str, int]:
    """(how the run came back, completed steps lost): ``done_before`` steps were done by ``seq``, the fault
    came after ``seq0``, at ``t0``. Lost steps are read from the log; a run that came back by itself loses none,
    a restart fewer than a checkpoint interval, and goes on from the step after its checkpoint's. The seconds
    said are from the fault."""
    if component in ("teacher/proxy", "teacher/0", "agent/"):
        # started again by the driver: a new process registers under the same name
        wait_until(lambda: chaos.pid(component) != killed, 120, f"{component} to be started again", every_s=0.3)
        # named as dead by the driver that started it again (its new self registers before a silence could)
        said = [e for e in chaos.events() if e["seq"] > seq0 and e["kind"] == "alert"
                and e["code"] == "restarted_by_driver" and any(t.startswith(component) for t in e["targets"])]
        assert said and not said[0].get("cleared"), said
        chaos.wait_step(done_before + 2, 120, f"training to go on after {component} was started again")
        lost = chaos.lost(done_before, seq)
        assert lost == 0, (f"{component} started again by the driver, yet {lost} step(s) were trained again "
                           f"(seed {SEED})")
        return f"started again by the driver, {time.time() - t0:.0f} s", lost

    def moving_or_failed():
        states = [e for e in chaos.events() if e["seq"] > seq0 and e["kind"] == "run"]
        if states and states[-1]["state"] in ("failed", "stopped"):
            return "failed"
        return "moving" if chaos.step() >= done_before + 2 else None

    if component != "supervisor":
        how = wait_until(moving_or_failed, 180, f"the run to go on or fail after {component} was killed",
                         every_s=0.3)
        if how == "moving":
            lost = chaos.lost(done_before, seq)
            assert lost == 0, f"the run recovered by itself, yet {lost} step(s) were trained again (seed {SEED})"
            return "recovered by itself", lost
    else:
        # the driver's SIGTERM (the kernel's, its parent gone) goes to its process group, Ray's head
        # processes and agents with it (gkd_core/lifeline.py); without it Ray's agents spent 60 s more
        chaos.wait_ended(45, "the driver and its Ray to end with the supervisor")
    seq1 = chaos.events()[-1]["seq"]
    out = chaos.gkd("restart", str(chaos.run))
    assert out.returncode == 0, out.stderr + out.stdout
    def trained():  # a step trained after the restart (not the checkpoint's own metrics, said again)
        resumed, steps = chaos.after_restart(seq1)  # resumed 0: no checkpoint, from the start
        return (resumed, steps) if steps else None

    resumed, steps = wait_until(trained, 180, "the restarted driver to train a step", every_s=0.3)
    assert steps[0] == resumed + 1, f"the restart resumed from step {resumed} but trained step {steps[0]} first"
    lost = max(0, done_before - resumed)  # the steps after the checkpoint's, trained again
    assert lost < CHECKPOINT_EVERY, (f"{lost} step(s) lost: {done_before} done, resumed from {resumed}, a checkpoint "
                                     f"every {CHECKPOINT_EVERY} (seed {SEED})")
    return f"`gkd-tui restart`: from step {resumed}, {time.time() - t0:.0f} s", lost


def test_the_log_check_says_no_to_a_step_missing_or_repeated_a_seq_out_of_order_and_a_torn_line(tmp_path):
    """log_problems, on logs written here: what the table's "log intact" rests on can say no."""
    class Run:
        run = tmp_path

    chaos = Chaos(Run(), tmp_path)
    run = {"kind": "run", "state": "running"}
    resumed = {"kind": "log", "message": "resumed from ckpt/step-2 (step 2, prompt 0 of epoch 0)"}

    def check(*events, tail=b""):
        lines = [json.dumps({"seq": i, **e}).encode() for i, e in enumerate(events, 1)]
        (tmp_path / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n" + tail)
        return chaos.log_problems()

    def m(step):
        return {"kind": "metrics", "step": step}

    assert check(run, m(1), m(2), m(3)) == ""
    assert check(run, m(1), m(2), m(3), tail=b'{"seq": 9, "kind": "me') == ""  # a line still being written
    # killed after step 3, resumed from the checkpoint of step 2: its metrics said again, then 3 trained again
    assert check(run, m(1), m(2), m(3), run, resumed, m(2), m(3), m(4)) == ""
    # the checkpoint of 2 saved and its driver killed before step 2's metrics left: said by the resumed one
    assert check(run, m(1), run, resumed, m(2), m(3)) == ""
    # the log lost steps before the resume (a supervisor killed with them unwritten): missing, said so
    assert check(run, m(1), run, resumed, m(3)) == "line 5: a resume from step 2, but the log has steps only to 1"
    late = {"kind": "log", "message": "resumed from ckpt/step-5 (step 5, prompt 0 of epoch 0)"}
    assert check(run, m(1), m(2), run, late, m(5), m(6)) == (
        "line 7: a resume from step 5, but the log has steps only to 2")
    assert check(run, m(1), m(3)) == "line 3: step 3 after step 1"
    assert check(run, m(1), m(2), m(2)) == "line 4: step 2 after step 2"
    # a supervisor killed while behind: the one taking over says which steps the log lost, and they are not missing
    said = {"kind": "log", "level": "warn", "message": "the log lost steps 3-4: checkpoint step_000005 holds step 5"}
    assert check(run, m(1), m(2), run, said, late, m(5), m(6)) == ""
    assert check(run, m(1), run, said, late, m(5)) == "line 4: the log says it lost steps 3-4, after step 1"
    assert check(run, m(1), m(2), run, said, late, m(5), m(7)).startswith("line 8: step 7 after step 5")
    # ... and the checkpoint's own step, which the take-over does not call lost, must be said by the driver
    assert check(run, m(1), m(2), run, said, late, m(6)) == (
        "line 7: a resume from step 5, but the log has steps only to 4")
    assert check(run, m(1), m(2), m(3), run, resumed, m(2), m(4)).startswith("line 8: step 4 after step 3")
    (tmp_path / "events.jsonl").write_bytes(b'{"seq": 1}\n{"seq": 1}\n')
    assert chaos.log_problems() == "line 2: seq 1 after 1"
    (tmp_path / "events.jsonl").write_bytes(b'{"seq": 1}\nnot json\n{"seq": 3}\n')
    assert chaos.log_problems().startswith("line 2 is not JSON")


def test_the_naming_check_says_no_to_the_wrong_process_even_when_its_message_names_the_right_one(tmp_path):
    """Chaos.named, on logs written here: what the table's "said by" rests on can say no."""
    class Run:
        run = tmp_path

    chaos = Chaos(Run(), tmp_path)
    t0 = 1000.0

    def named(src, *alerts):
        lines = [json.dumps({"seq": i, "kind": "alert", "severity": "critical", "code": "heartbeat_stale",
                             "message": "", "targets": [], "ts": t0 + 1, **a}) for i, a in enumerate(alerts, 1)]
        (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
        return chaos.named(t0, src)

    # a straggler alert on rollout/1 that mentions student/0 is not student/0 named
    with pytest.raises(AssertionError, match="named rollout/1"):
        named("student/0", {"code": "straggler", "targets": ["rollout/1"], "message": "waiting for student/0"})
    assert named("student/0", {"targets": ["student/0"]}) == "alert heartbeat_stale (diagnosis), 1.0 s"
    # a warning before it names nobody; a critical one before the fault is not this fault's
    assert named("student/0", {"severity": "warn", "targets": ["rollout/1"]}, {"ts": t0 - 1, "targets": ["rollout/0"]},
                 {"targets": ["student/0"], "ts": t0 + 4}) == "alert heartbeat_stale (diagnosis), 4.0 s"
    assert named("student/0", {"severity": "warn", "targets": ["student/0"]}) == ""  # not named yet
    with pytest.raises(AssertionError, match="only after 12.0 s"):
        named("student/0", {"targets": ["student/0"], "ts": t0 + 12})
    # the driver's own reports: its failure naming the worker that ended it; its restart of one (a warning)
    assert named("rollout/0", {"code": "driver_failed", "targets": ["rollout/0"]}).endswith("(driver), 1.0 s")
    assert named("agent/", {"code": "restarted_by_driver", "severity": "warn", "targets": ["agent/vm"]}) \
        == "alert restarted_by_driver (driver), 1.0 s"
    with pytest.raises(AssertionError, match="named driver"):
        named("student/0", {"code": "driver_failed", "targets": ["driver"], "message": "student/0 died"})
