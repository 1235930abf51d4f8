"""Chaos at random moments: a fault in one process of a real run, many times, and who is named first.

And as long again of healthy running, to count the alarms no fault explains.

    python bench/chaos_trials.py [--trials 20] [--faults signal never_joins sync_hang oom teacher_errors slow deadlock]
                                 [--kinds student rollout teacher proxy driver agent ray_actors]
                                 [--seed 1] [--record bench/chaos_trials.jsonl] [--table tests/chaos/CHAOS.md]
                                 [--set KEY=VALUE ...]
    python bench/chaos_trials.py --render-only [--check]
    python bench/chaos_trials.py --smoke     # one trial and its healthy window, into a scratch record (CI)

One real run of the embedded demo (the real trainer, a local Ray cluster, the chaos suite's settings:
tests/chaos/test_chaos.py ``SETTINGS``, the shipped checkpoint interval) takes every trial in turn. The matrix's
cells (tests/chaos/chaos_table.py ``CELLS``) are a fault on a kind of process, where it applies:

- **signal**, on each process (a student, a rollout, the teacher's worker or proxy, the driver, the node agent):
  SIGKILL, or SIGSTOP held until it is named or the window ends, drawn per trial; its round gives the moment
  (``--moments``, in turn): a random delay after a step ends, or inside a weight sync: armed for the student to
  send at the start of its next sync (gkd_core/trainer/faults.py ``arm``; a sync lasts tens of milliseconds,
  which no watcher outside the run can aim at);
- **never_joins** (the student, a rollout): a rank that never joins the sync's broadcast, hung before it;
- **sync_hang** (the student, a rollout): a part of the sync after the broadcast that does not end;
- **oom** (the student, a rollout, the teacher's worker): memory growing 30 MB/s inside a memory cgroup of its
  own (made for the trial, root only) until the kernel's OOM killer ends it;
- **teacher_errors** (the teacher's worker): every request answered with an error;
- **slow** (a rollout): three times slower than its peer at generating, step after step;
- **deadlock** (a plain Ray job's actors, tests/jobs/ray_deadlock.py under `gkd-tui launch --`, a launch per trial,
  after the run's trials): healthy for a random time, then two actors' calls that wait on each other, or a
  broadcast whose root first waits on the rank inside it; the job's healthy time is the trial's healthy window.

The faults but the signals are armed for the worker after a random delay once a step ends, and strike at its
next point where they can (``arm_fault``: its next sync, its next request), said by the worker when they do; a
hang, a slow part and a run of errors last past the window (``HOLD_S``) and end, and the run goes on. Where each
landed is read from the log afterwards: the step, and the phase of the target and of the student. Then, from
``events.jsonl`` alone:

- **named**: the first naming after the fault (tests/chaos/chaos_naming.py: a critical alert, or the
  driver's word that it started the process again); right when the process hit is in its targets within the
  cell's bound (10 s; memory growth 15 s), and told apart as the diagnosis (a rule inferring it) or the
  driver's own report.
- **after**: seconds from the fault to that alert (a trial waits 5 s past the bound).

Each round of cells is followed by a healthy window as long as the round's trials are watched (no fault):
every critical alert in it is a false alarm. Then the run is brought back (SIGCONT; or it recovers by
itself; or ``gkd-tui restart`` resumes it from its latest checkpoint) and the next trial begins.

The record (``--record``, JSON lines) is written as it goes: a line when a trial starts, and its row when it
ends, done, crashed (the runner's error) or cut (a time limit, Ctrl-C); a trial started with no end is one
the runner died in. ``--table`` (and ``--render-only``) renders the whole record into the fault matrix
between the markers of tests/chaos/CHAOS.md; ``--check`` fails when the file's table is not the record's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "chaos")]

import chaos_table as matrix  # noqa: E402
from cgroups import NoCgroup, memory_cgroup  # noqa: E402
from chaos_naming import WARNING_FINDINGS, alarms_in, first_naming, hits  # noqa: E402
from chaos_table import ARMED, CELLS, JOBS, KINDS, OOM_HEADROOM, PROCESSES, RUNNER, SIGNAL, within_s  # noqa: E402
from conftest import RunningSupervisor, gkd_tui, logged_events, status_json, wait_until  # noqa: E402
from pipeline_stalls import said  # noqa: E402
from test_chaos import SETTINGS, TRAINER, Chaos  # noqa: E402

from gkd_core.trainer.faults import ARMED as ARMED_SIGNAL  # noqa: E402
from gkd_core.trainer.faults import arm, arm_fault, armed_file  # noqa: E402

MOMENTS = ("after_step", "in_sync")
JOB_FILES = {"deadlock": ROOT / "tests" / "jobs" / "ray_deadlock.py"}  # the job of each of JOBS' faults
JOB_HEALTHY_S = (10.0, 40.0)  # a job's healthy time before its fault, drawn per trial
TABLE = ROOT / "tests" / "chaos" / "CHAOS.md"


class TailedRun(Chaos):
    """The run, its event log read as it grows: only the bytes written since the last look are parsed. A
    whole re-read at every poll (the tests' way, for runs of a minute) grows with the run, and over an
    hour of trials it slowed the polling enough to add seconds to every time measured."""

    def __init__(self, sup, home: Path):
        super().__init__(sup, home)
        self._seen: list[dict] = []
        self._offset = 0
        self._step = 0

    def events(self) -> list[dict]:
        with (self.run / "events.jsonl").open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written waits for the next look
        self._offset += len(whole)
        for line in whole.splitlines():
            try:
                e = json.loads(line)
            except ValueError:
                continue  # a line torn by a killed supervisor (set aside by the next one)
            self._seen.append(e)
            if e["kind"] == "metrics":
                self._step = max(self._step, e["step"])
        return self._seen

    def step(self) -> int:
        self.events()
        return self._step


def phase_of(chaos: Chaos, src: str, t0: float) -> str:
    return next((e["phase"] for e in reversed(chaos.events())
                 if e["kind"] == "phase" and e["src"].startswith(src) and e["ts"] <= t0), "?")


def step_at(chaos: Chaos, t0: float) -> int:
    return max((e["step"] for e in chaos.events() if e["kind"] == "metrics" and e["ts"] <= t0), default=0)


def run_failed_since(chaos: Chaos, seq: int) -> bool:
    states = [e for e in chaos.events() if e["seq"] > seq and e["kind"] == "run"]
    return bool(states) and states[-1]["state"] in ("failed", "stopped")


def bring_back(chaos: Chaos, signalled: str, pid: int, seq0: int, done_before: int) -> str:
    """Until training goes on again: how."""
    if signalled == "stop":
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass

    def moving_or_failed():
        if run_failed_since(chaos, seq0):
            return "failed"
        return "moving" if chaos.step() >= done_before + 2 else None

    how = wait_until(moving_or_failed, 240, "the run to go on or fail", every_s=0.3)
    time.sleep(2.0)  # a failure said a moment after the steps that were under way
    if how == "moving" and not run_failed_since(chaos, seq0):
        return "went on by itself"
    seq1 = chaos.events()[-1]["seq"]
    out = chaos.gkd("restart", str(chaos.run))
    if out.returncode != 0:
        raise RuntimeError(f"gkd-tui restart failed: {out.stderr}{out.stdout}")

    def trained():  # a step trained after the restart (not the checkpoint's own metrics, said again)
        resumed, steps = chaos.after_restart(seq1)
        return (resumed, steps) if steps else None

    resumed, _ = wait_until(trained, 240, "the restarted driver to train a step", every_s=0.3)
    return f"restarted from step {resumed}"


def fault_trial(chaos: Chaos, seed: str, fault: str, kind: str, moment: str) -> dict:
    """One fault of the cell (``fault``, ``kind``): struck, watched for its naming, and the run brought back."""
    rng = random.Random(seed)
    src = rng.choice(KINDS[kind])
    signalled = rng.choice(["kill", "stop"]) if fault == SIGNAL else ""
    delay = rng.uniform(0.0, 0.6)  # about a step of the demo
    chaos.quiet()
    chaos.wait_step(chaos.step(), 240, "a step to end")
    pid = chaos.pid(src)
    src = next(e["src"] for e in reversed(chaos.events()) if e["kind"] == "worker" and e["src"].startswith(src))
    seq0, before = chaos.events()[-1]["seq"], chaos.step()
    with oom_cgroup(chaos, src, pid) if fault == "oom" else contextlib.nullcontext():
        if signalled:
            t0 = send_signal(chaos, pid, signal.SIGKILL if signalled == "kill" else signal.SIGSTOP, moment, delay)
        else:
            moment = "armed"
            time.sleep(delay)
            t0 = strike(chaos, src, *ARMED[fault][kind])
        window_s = within_s(fault) + 5
        naming = None
        deadline = time.monotonic() + window_s
        while naming is None and time.monotonic() < deadline:
            time.sleep(0.2)
            naming = first_naming(chaos.events(), t0, src)
        if fault == "oom":  # the kernel's OOM killer, not the cgroup's removal, ends it (due some 20 s in)
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 30, f"{src} killed by the OOM killer")
    time.sleep(0.2)  # the log is flushed every 100 ms: where it landed is read once the moment is written
    row = {"target": src, "fault": signalled or fault, "moment": moment, "delay_s": round(delay, 3)
           if moment != "in_sync" else None, "at_step": step_at(chaos, t0), "phase": phase_of(chaos, src, t0),
           "student_phase": phase_of(chaos, "student/0", t0),
           # in_sync: armed for the student's next sync start (the older rows' were aimed from the live events)
           "aim": "armed" if moment in ("in_sync", "armed") else "", "window_s": window_s,
           "named": naming.targets if naming else [], "code": naming.code if naming else "",
           "severity": naming.severity if naming else "", "by": naming.by if naming else "",
           "message": naming.message[:300] if naming else "", "after_s": naming.after_s if naming else None}
    row["right"] = bool(naming) and naming.right and naming.after_s <= within_s(fault)
    t1 = time.time()
    row["recovery"] = bring_back(chaos, signalled, pid, seq0, before)
    row["recovery_s"] = round(time.time() - t1, 1)
    return row


def send_signal(chaos: Chaos, pid: int, sig: signal.Signals, moment: str, delay: float) -> float:
    """``sig`` to ``pid`` after ``delay``, or armed for the start of the student's next sync: when it was sent."""
    if moment != "in_sync":
        time.sleep(delay)
        t0 = time.time()
        os.kill(pid, sig)
        return t0
    # armed for the student to send at the start of its next sync: inside it, whoever the target is
    fired = arm(chaos.run, pid, sig)
    try:
        said = wait_until(lambda: fired.exists() and fired.read_text(), 60,
                          "the armed fault to fire in a weight sync", every_s=0.01)
    finally:  # not fired: disarmed, so that it does not fire in a later trial or a healthy window
        (chaos.run / ARMED_SIGNAL).unlink(missing_ok=True)
    return json.loads(said)["ts"]


class NotStruck(RuntimeError):
    """An armed fault that did not strike within its time (its worker never reached a point where it can, or
    claimed it for a step that never came): no trial, said as such, and the runner goes on."""


def strike(chaos: Chaos, src: str, kind: str, fields: dict) -> float:
    """A fault armed for ``src`` (``arm_fault``), struck at its next point where it can: when it struck."""
    fired = arm_fault(chaos.run, src, kind, **fields)
    try:
        said = wait_until(lambda: fired.exists() and fired.read_text(), 60, f"{kind} to strike {src}", every_s=0.01)
    except AssertionError as e:
        raise NotStruck(str(e)) from None
    finally:  # not struck: disarmed, so that it does not strike in a later trial or a healthy window
        armed_file(chaos.run, src).unlink(missing_ok=True)
    return json.loads(said)["ts"]


@contextlib.contextmanager
def oom_cgroup(chaos: Chaos, src: str, pid: int):
    """``pid`` in a memory cgroup of its own of ``OOM_HEADROOM`` (what it allocates from now is charged to it), once
    its heartbeat names that cgroup as its limit (a process looks its cgroup up again every 30 s); on the way out
    whatever is left in it is killed and it is removed."""
    with memory_cgroup(OOM_HEADROOM, f"gkd-chaos-{os.getpid()}-{pid}") as cgroup:
        (cgroup / "cgroup.procs").write_text(str(pid))

        def named_its_scope():
            mem = ((((status_json(chaos.run) or {}).get("state") or {}).get("workers") or {}).get(src) or {}).get("mem")
            return (mem or [None])[0] == str(cgroup) or None  # a MemoryBeat: [scope, used, limit, ...]

        wait_until(named_its_scope, 60, f"{src}'s heartbeat to name its cgroup", every_s=1.0)
        yield cgroup


def job_trial(seed: str, fault: str, kind: str) -> list[dict]:
    """A plain Ray job under `gkd-tui launch --` in a GKD_HOME of its own, healthy for a time drawn from the seed,
    then its fault (``JOBS``): the rows of its fault and of its healthy time (from its launch to the fault)."""
    rng = random.Random(seed)
    job, ways = JOB_FILES[fault], JOBS[fault][1]
    how = rng.choice(sorted(ways))
    healthy_s = round(rng.uniform(*JOB_HEALTHY_S), 1)
    members = ways[how]
    home = Path(tempfile.mkdtemp(prefix="gkd-chaos-job-"))
    launched = time.time()
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(job), str(healthy_s), how,
                  home=home)
    if got.returncode != 0:
        raise RuntimeError(f"gkd-tui launch failed: {got.stderr.strip()[-300:]}")
    run = next((home / "runs").iterdir())
    window_s = within_s(fault) + 5
    try:
        t0 = float(wait_until(lambda: said(run, "DEADLOCK AT"), healthy_s + 180, "the job's healthy rounds to end",
                              every_s=0.5))
        naming, deadline = None, time.monotonic() + window_s
        while naming is None and time.monotonic() < deadline:
            time.sleep(0.2)
            naming = first_naming(logged_events(run), t0, members[0])
        time.sleep(0.2)
        events = logged_events(run)
    finally:
        gkd_tui("stop", str(run), home=home)
        shutil.rmtree(home, ignore_errors=True)  # what a trial keeps is its rows
    healthy = {"kind": "healthy", "window_s": round(t0 - launched, 1), "steps": 0, "job": job.name,
               **said_between(events, launched, t0)}
    row = {"target": members[0], "members": members, "fault": fault, "how": how, "moment": "after_healthy",
           "delay_s": healthy_s, "at_step": 0, "phase": "-", "student_phase": "-", "aim": "", "window_s": window_s,
           "named": naming.targets if naming else [], "code": naming.code if naming else "",
           "severity": naming.severity if naming else "", "by": naming.by if naming else "",
           "message": naming.message[:300] if naming else "", "after_s": naming.after_s if naming else None,
           "recovery": "stopped (a deadlock holds until the run is stopped)", "recovery_s": 0.0}
    row["right"] = (bool(naming) and all(hits(naming.targets, m) for m in members)
                    and naming.after_s <= within_s(fault))
    return [row, healthy]


def said_between(events: list[dict], t0: float, t1: float) -> dict:
    """The critical alerts in ``[t0, t1)`` (each a false alarm where no fault was made) and the warnings, counted."""
    warned = Counter(e["code"] for e in events if t0 <= e["ts"] < t1 and e.get("kind") == "alert"
                     and not e.get("cleared") and e.get("severity") == "warn" and e["code"] not in WARNING_FINDINGS)
    return {"warnings": dict(warned),
            "alarms": [{"code": e["code"], "targets": e["targets"], "message": e.get("message", "")[:300],
                        "after_s": round(e["ts"] - t0, 2)} for e in alarms_in(events, t0, t1)]}


def healthy_window(chaos: Chaos, window_s: float) -> dict:
    """``window_s`` of the run left alone: every critical alert in it is a false alarm."""
    chaos.quiet()
    t0, before = time.time(), chaos.step()
    time.sleep(window_s)
    time.sleep(0.3)  # the window's last events flushed to the log
    events = chaos.events()
    # warnings are no false alarms (nothing to act on yet), but are counted: a rule that warns in healthy running
    return {"window_s": window_s, "steps": chaos.step() - before, **said_between(events, t0, t0 + window_s)}


def append(path: Path, row: dict) -> None:
    """One line, on disk before the next step: a runner that dies keeps what it wrote."""
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


def shown(path: Path) -> str:
    """A path as the repository names it, where it is in the repository."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _interrupted(*_) -> None:
    """A SIGTERM (a time limit) ends it as Ctrl-C does: the trial under way is recorded as cut, the run stopped."""
    raise KeyboardInterrupt


def run_trials(a: argparse.Namespace, record: Path, command: str) -> None:
    cells = [(f, k) for f, k in CELLS if f in a.faults and k in a.kinds]
    if any(f == "oom" for f, _ in cells):
        try:
            with memory_cgroup(1 << 30, f"gkd-chaos-probe-{os.getpid()}"):
                pass
        except NoCgroup as e:
            print(f"the oom cells are left out: no memory cgroup can be made here ({e}); they need root",
                  file=sys.stderr)
            cells = [c for c in cells if c[0] != "oom"]
    if not cells:
        raise SystemExit(f"no cell of the matrix is a fault of {a.faults} on {a.kinds}: see "
                         "tests/chaos/chaos_table.py CELLS")
    seeds = (f"{a.seed}/{i}" for i in itertools.count())
    in_the_run = [c for c in cells if c[0] not in JOBS]
    if in_the_run:
        trials_in_one_run(a, record, command, in_the_run, seeds)
    for _ in range(a.trials):  # a job's trials: a launch each, after the run's (whose CPU they would share)
        for fault, kind in [c for c in cells if c[0] in JOBS]:
            seed = next(seeds)
            heads = [{"runner": RUNNER, "command": command, "seed": s, "kind": k}
                     for s, k in ((seed, kind), (f"{seed}/healthy", "healthy"))]
            recorded(record, heads, functools.partial(job_trial, seed, fault, kind))


def trials_in_one_run(a: argparse.Namespace, record: Path, command: str, cells: list[tuple[str, str]],
                      seeds: Iterator[str]) -> None:
    """The cells' trials in one real run, round by round, each round followed by its healthy window."""
    home = Path(tempfile.mkdtemp(prefix="gkd-chaos-"))
    os.environ["GKD_HOME"] = str(home)
    sup = RunningSupervisor(home, [*SETTINGS, *a.set, "--linger", "3600", "--driver", TRAINER], dict(os.environ))
    chaos = TailedRun(sup, home)
    healthy_s = sum(within_s(f) + 5 for f, _ in cells)  # a round's faults are watched this long: as long again healthy
    order = [c for _ in range(a.trials) for c in [*cells, ("", "healthy")]]
    per_round = len(cells) + 1  # a round: a fault of each cell, then a healthy window
    try:
        chaos.wait_step(2, 300, "the run's first steps")
        for i, (fault, kind) in enumerate(order):
            head = {"runner": RUNNER, "command": command, "seed": next(seeds), "kind": kind}
            moment = a.moments[(i // per_round) % len(a.moments)]
            trial = (functools.partial(healthy_window, chaos, healthy_s) if kind == "healthy" else
                     functools.partial(fault_trial, chaos, head["seed"], fault, kind, moment))
            recorded(record, [head], lambda: [trial()])  # noqa: B023  (called here, in this turn of the loop)
    finally:
        chaos.gkd("stop", str(chaos.run))
        sup.kill()


def recorded(record: Path, heads: list[dict], trial: Callable[[], list[dict]]) -> None:
    """One trial, its rows (one per head, in order) on the record: a line for each as it starts, then each row as
    it ends, done, crashed (the runner's error, then raised) or cut (a time limit, Ctrl-C)."""
    for head in heads:
        append(record, {**head, "status": "started", "ts": round(time.time(), 3)})
    try:
        rows = trial()
    except KeyboardInterrupt:
        for head in heads:
            append(record, {**head, "status": "cut", "error": "stopped by a time limit or Ctrl-C"})
        raise
    except NotStruck as exc:  # no fault was made: said, and the next trial begins
        for head in heads:
            append(record, {**head, "status": "not struck", "error": str(exc)[:500]})
        print(f"{heads[0]['seed']} {heads[0]['kind']}: not struck: {exc}"[:300], flush=True)
        return
    except Exception as exc:
        for head in heads:
            append(record, {**head, "status": "crashed", "error": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    for head, row in zip(heads, rows, strict=True):
        append(record, {**head, **row, "status": "done"})
        print(f"{head['seed']} {head['kind']}: " + (
            f"{len(row['alarms'])} false alarm(s) in {row['window_s']:g} s" if head["kind"] == "healthy" else
            f"{row['fault']} {row['target']} ({row['moment']}, {row['phase']}): "
            f"{'RIGHT' if row['right'] else 'MISS'} {row['code']} {row['named']} {row['after_s']} s; "
            f"{row['recovery']}"), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=20, help="per cell (and as many healthy windows)")
    faults = list(dict.fromkeys(f for f, _ in CELLS))
    p.add_argument("--faults", nargs="+", default=faults, choices=faults, help="the cells of these faults ...")
    p.add_argument("--kinds", nargs="+", default=PROCESSES, choices=PROCESSES, help="... on these processes")
    p.add_argument("--seed", default="1")
    p.add_argument("--moments", nargs="+", default=list(MOMENTS), choices=MOMENTS,
                   help="the moments the rounds take in turn: every kind's faults land in each as often")
    p.add_argument("--record", default=str(ROOT / "bench" / "chaos_trials.jsonl"))
    p.add_argument("--table", default=str(TABLE), help="render the whole record into this file, between its markers")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="settings for the run beside the chaos suite's (a bigger model: a longer sync to land in)")
    p.add_argument("--render-only", action="store_true", help="no trials: only the table, from the record")
    p.add_argument("--check", action="store_true", help="with --render-only: fail if the table is not the record's")
    p.add_argument("--smoke", action="store_true",
                   help="two real trials (a signal to the teacher in a sync, its errors) and their healthy window, "
                        "into a record and table of their own")
    a = p.parse_args()
    record, table = Path(a.record), Path(a.table)
    if a.smoke:  # the same code path, on the smallest size; the committed record and table are left alone
        scratch = Path(tempfile.mkdtemp(prefix="gkd-chaos-smoke-"))
        record, table = scratch / "trials.jsonl", scratch / "CHAOS.md"
        table.write_text("# smoke\n")
        # the signal armed for a sync, and a fault armed for a worker
        a.trials, a.faults, a.kinds, a.seed = 1, [SIGNAL, "teacher_errors"], ["teacher"], "smoke"
        a.moments = ["in_sync"]
    if a.render_only:
        rendered = matrix.block(matrix.read_record(record))
        if a.check:
            if matrix.table_in(table.read_text()) != rendered:
                print(f"{shown(table)}: its random trials' table is not what {shown(record)} renders; run "
                      f"`python bench/chaos_trials.py --render-only` and commit the result", file=sys.stderr)
                return 1
            print(f"{shown(table)}: the random trials' table is the record's ({len(matrix.read_record(record))} lines)")
            return 0
        matrix.write_table(table, matrix.read_record(record))
        return 0
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        run_trials(a, record, "python bench/chaos_trials.py " + " ".join(sys.argv[1:]))
    finally:
        matrix.write_table(table, matrix.read_record(record))
    if a.smoke:
        done, unfinished, _ = matrix.trials_of(matrix.read_record(record))
        print(matrix.table_in(table.read_text()))
        if len(done) != 3 or unfinished or not all(r["right"] for r in done if r["kind"] != "healthy"):
            print("smoke: a trial did not name the teacher, or did not end", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
