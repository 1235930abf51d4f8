"""ETTR under faults (#56): the share of a run's wall time spent on steps that were kept, over an hour of the
default demo with a fault every ~5 minutes, side by side in one run: the recovery policy on (``--restart-on``,
and ``trainer.replace_rollouts``: a rollout that dies or is stopped frozen is started again in place, not the run)
and nobody but a person who answers 30 minutes after the first critical alert (simulated: ``gkd-tui restart``
then, as they would).

Both arms run at once on this machine, each a run of the demo trainer (``trainer.total_steps`` past the hour),
each with the same faults in the same order at the same intervals (drawn from ``--seed``): 4 to 6 minutes after
the previous one, once the run trains again (a run that hangs cannot fault again). A fault is one of:

    kill      a rollout worker killed -9 (its actor dies; the driver's wait for it fails)
    freeze    a rollout worker stopped (SIGSTOP) between steps
    sync      a rollout worker stopped the moment a weight sync starts: a rank frozen in its broadcast
    teacher   the teacher's server stopped: requests sent, none answered

A step is kept when the run's next driver did not train it again: the steps after the checkpoint a restart
resumed from are lost, and their time with them. ETTR = the kept steps' own time (a step: from the previous
step's end, or, for a driver's first, its parts' seconds) over the wall time from the run's start to the
bench's end. The policy arm's goal (#56): at least 0.90.

    python bench/bench_ettr.py                  # an hour; a line of bench/ettr.jsonl, the table in RESULTS.md
    python bench/bench_ettr.py --smoke          # 2 minutes, a freeze in each arm, a person answering in 60 s
    python bench/bench_ettr.py --render-only --check   # RESULTS.md's table is the record's
    python bench/bench_ettr.py --remeasure DIR  # the last hour measured again from its runs kept (--keep) in DIR
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from conftest import RunningSupervisor  # noqa: E402

TRAINER = "gkd_core.trainer.driver"
RECORD = ROOT / "bench" / "ettr.jsonl"
RESULTS = ROOT / "bench" / "RESULTS.md"
MARKERS = ("<!-- ettr -->", "<!-- /ettr -->")
FAULTS = ("kill", "freeze", "sync", "teacher")
# what the policy restarts on: the findings each fault above is named by (a worker silent, dead, frozen in a
# collective, the run failed by the driver's own deadline, the teacher not serving)
RESTART_ON = ("heartbeat_stale,actor_dead,driver_failed,sync_timed_out,collective_stuck,collective_not_joined,"
              "teacher_not_serving,teacher_unreached,deadlock")
# the policy's grace: the rules already wait about 5 s before a worker's silence is critical, so a finding held
# 5 s more has held about 10 s in all (a user's default is 60 s: this bench is a night of faults every 5 minutes)
GRACE_S = 5.0
RESUMED = re.compile(r"resumed from checkpoints/step_0*(\d+)")
# how ETTR is measured: 2, a step that spans a fault's stall keeps only its time outside it (a worker replaced in
# place: the step waits and goes on, and its wait is no training); 1 (records before), the whole of a kept step
MEASURE = 2
# the events it reads (a line's kind is near its start): steps, the run's states, its alerts and actions, the
# workers' pids, syncs, and the driver's word of the checkpoint it resumed from
KINDS_READ = tuple(b'"kind":"%s"' % k for k in (b"metrics", b"run", b"alert", b"action", b"worker", b"sync", b"log"))


@dataclass
class Arm:
    name: str  # "policy" or "person"
    home: Path
    sup: RunningSupervisor | None = None
    faults: list[tuple[float, str, str]] = field(default_factory=list)  # (when, kind, on whom)
    answers: list[float] = field(default_factory=list)  # the person's restarts
    _events: list[dict] = field(default_factory=list)
    _read: int = 0  # bytes of the event log read so far
    kept_run: Path | None = None  # a run kept from an hour before (``--remeasure``), read instead of a live one

    @property
    def run(self) -> Path:
        if self.kept_run is not None:
            return self.kept_run
        assert self.sup is not None
        return self.sup.run

    def events(self) -> list[dict]:
        """The run's events of the kinds this bench reads, so far: the log read on from where it was left (an
        hour of the demo is hundreds of MB, mostly heartbeats and phases, and this is asked every second)."""
        path = self.run / "events.jsonl"
        if not path.exists():
            return self._events
        with path.open("rb") as f:
            f.seek(self._read)
            chunk = f.read()
        whole = chunk[:chunk.rfind(b"\n") + 1]  # (a torn last line: read again when it is whole)
        self._read += len(whole)
        for line in whole.splitlines():
            if any(kind in line[:80] for kind in KINDS_READ):
                try:
                    self._events.append(json.loads(line))
                except ValueError:
                    pass
        return self._events

    def pid(self, src: str) -> int:
        regs = [e for e in self.events() if e["kind"] == "worker" and e["src"] == src and e.get("pid")]
        return regs[-1]["pid"] if regs else 0


def prepared_cache(scratch: Path) -> Path:
    """The demo's models and data, made once for both arms (each links it), so that neither arm's start pays for
    it, nor both at once into one folder: in ``$GKD_HOME/cache`` when GKD_HOME is set (``bench/smoke.sh``'s, shared
    by its benches; made there if it is not yet), else in the scratch folder."""
    from gkd_core.config import load_config
    from gkd_core.trainer import inputs

    home = Path(os.environ["GKD_HOME"]) if os.environ.get("GKD_HOME") else scratch
    inputs.prepare(load_config(None), home, log=lambda *_: None)
    return home / "cache"


def start(arm: Arm, policy: bool, grace_s: float, cache: Path) -> None:
    arm.home.mkdir(parents=True)
    (arm.home / "cache").symlink_to(cache)
    env = dict(os.environ, GKD_HOME=str(arm.home))
    args = ["trainer.total_steps=1000000", "--linger", "7200", "--driver", TRAINER]
    if policy:  # (a rollout replaced in place, not the run: the policy's arm, as one leaving a run overnight sets it)
        args[1:1] = ["trainer.replace_rollouts=true"]
        args += ["--restart-on", RESTART_ON, "--restart-grace", str(grace_s), "--restart-budget", "60"]
    arm.sup = RunningSupervisor(arm.home, args, env)


def training(arm: Arm, since: float, within_s: float = 60.0) -> bool:
    """The run's newest driver trained a step after ``since`` and within the last ``within_s`` seconds, and
    nothing critical holds: healthy, so a fault may come. (A step the driver the fault hung said after it is not
    one: a fault then would hit a process about to be replaced.)"""
    evs = arm.events()
    began = max((e["ts"] for e in evs if e["kind"] == "run" and e["state"] == "running"), default=0.0)
    steps = [e["ts"] for e in evs if e["kind"] == "metrics" and e["ts"] > max(since, began)]
    if not steps or time.time() - steps[-1] > within_s:
        return False
    active: dict[tuple, str] = {}
    for e in evs:
        if e["kind"] == "alert":
            key = (e["code"], tuple(e.get("targets") or ()))
            if e.get("cleared"):
                active.pop(key, None)
            else:
                active[key] = e.get("severity", "")
    return "critical" not in active.values()


def inject(arm: Arm, kind: str, rng: random.Random, until: float) -> str:
    """The fault, now (``sync``: at the next sync's start); on whom, or "" when it could not land by ``until``."""
    if kind == "teacher":
        target = "teacher/0"
    else:
        target = f"rollout/{rng.randrange(2)}"
    if kind == "sync":  # the moment a sync starts
        seen = {e["seq"] for e in arm.events() if e["kind"] == "sync"}
        while time.time() < until:
            if any(e["kind"] == "sync" and e["state"] == "started" and e["seq"] not in seen for e in arm.events()):
                break
            time.sleep(0.05)
        else:
            return ""
    pid = arm.pid(target)
    if not pid:
        return ""
    try:
        os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
    except ProcessLookupError:
        return ""
    return target


def person(arm: Arm, fault_at: float, answer_s: float, until: float) -> None:
    """A person: the first critical alert after the fault reaches them; they answer ``answer_s`` later, with
    `gkd-tui restart`, if the run is not training by then."""
    seen = None
    while time.time() < min(until, fault_at + answer_s) and seen is None:  # (nothing said: they look anyway)
        seen = next((e["ts"] for e in arm.events() if e["kind"] == "alert" and e["ts"] > fault_at
                     and e.get("severity") == "critical" and not e.get("cleared")), None)
        time.sleep(1.0)
    answer_at = (seen or fault_at) + answer_s
    while time.time() < min(answer_at, until):
        time.sleep(1.0)
    if time.time() >= until or training(arm, fault_at):
        return
    subprocess.run([sys.executable, "-m", "gkd_tui", "restart", str(arm.run)], env=dict(
        os.environ, GKD_HOME=str(arm.home)), capture_output=True, timeout=120, cwd=ROOT)
    arm.answers.append(time.time())


@dataclass(frozen=True)
class Plan:
    seed: int
    minutes: float
    answer_s: float  # the person's answer, after the alert
    gap_s: tuple[float, float]  # between a fault and the next, once the run trains again
    grace_s: float = GRACE_S
    kinds: tuple[str, ...] = FAULTS


def drive(arm: Arm, policy: bool, plan: Plan, cache: Path) -> None:
    """One arm: its run, the faults at their moments, the person (the person arm's)."""
    rng = random.Random(plan.seed)  # the same draws in both arms: the same faults at the same intervals
    kinds = [plan.kinds[i % len(plan.kinds)] for i in range(64)]
    rng.shuffle(kinds)
    start(arm, policy, plan.grace_s, cache)
    minutes, answer_s, gap_s = plan.minutes, plan.answer_s, plan.gap_s
    until = time.time() + minutes * 60
    last = 0.0
    for kind in kinds:
        gap = rng.uniform(*gap_s)
        while time.time() < until and not training(arm, last):
            time.sleep(1.0)  # hung, or restarting: it cannot fault again yet
        due = time.time() + gap
        while time.time() < min(due, until):
            time.sleep(1.0)
        if time.time() >= until:
            break
        target = inject(arm, kind, rng, until)
        if not target:
            continue
        last = time.time()
        arm.faults.append((last, kind, target))
        if not policy:
            person(arm, last, answer_s, until)


def kept_time(events: list[dict], end: float, stalls: list[tuple[float, float]] = ()) -> tuple[float, int, int]:
    """(the kept steps' seconds up to ``end``, the steps kept, the steps lost): each driver's steps, those a later
    driver trained again (past the checkpoint it resumed from) lost; a resuming driver's word of its checkpoint's
    step is not a step. ``stalls``: from each fault until a step was trained again, no time is effective: a step
    that spans one (a worker replaced in place: the step waited, then went on) keeps only its time outside it."""
    drivers: list[list[tuple[int, float]]] = []  # each driver's steps: (step, seconds)
    # the checkpoint each driver resumed from: 0 from the start (the first, or none saved), None while it has not
    # said (the last, restarted as the bench ended: the steps before it are not known to be lost)
    resumed: list[int | None] = []
    prev = 0.0
    for e in events:
        if e["ts"] > end:
            break
        if e["kind"] == "run" and e["state"] == "running":
            drivers.append([])
            resumed.append(0 if not drivers[:-1] else None)
            prev = 0.0
        elif e["kind"] == "log" and drivers and (m := RESUMED.search(e.get("message", ""))):
            resumed[-1] = int(m[1])
        elif e["kind"] == "metrics" and drivers and e["step"] > (resumed[-1] or 0):
            if resumed[-1] is None:
                resumed[-1] = 0  # a step trained before any word of a checkpoint: it started from scratch
            took = e["ts"] - prev if prev else sum(e.get("timing", {}).values())
            took -= sum(max(0.0, min(e["ts"], b) - max(e["ts"] - took, a)) for a, b in stalls)
            drivers[-1].append((e["step"], took))
            prev = e["ts"]
    kept_s, kept, lost = 0.0, 0, 0
    for i, steps in enumerate(drivers):
        redo_from = resumed[i + 1] if i + 1 < len(drivers) else None  # (None: none of its steps known lost)
        for step, took in steps:
            if redo_from is not None and step > redo_from:
                lost += 1
            else:
                kept_s, kept = kept_s + took, kept + 1
    return kept_s, kept, lost


def recoveries(events: list[dict], faults: list[tuple[float, str, str]], end: float) -> list[list[float | None]]:
    """For each fault, seconds from it until: the first critical alert after it, its recovery's start (the run's
    state "restarting", by the policy or the person; or its driver starting the worker again in place), and a step
    once it was over (of the driver started after it; or after the worker replaced was up); None for what did not
    come before the next fault or the end."""
    def first(pred, at: float, until: float) -> float | None:
        return next((round(e["ts"] - at, 1) for e in events if at < e["ts"] <= until and pred(e)), None)

    def replaced(e: dict, cleared: bool) -> bool:
        return e["kind"] == "alert" and e["code"] == "restarted_by_driver" and bool(e.get("cleared")) == cleared

    out: list[list[float | None]] = []
    for i, (at, _, _) in enumerate(faults):
        until = faults[i + 1][0] if i + 1 < len(faults) else end
        named = first(lambda e: e["kind"] == "alert" and e.get("severity") == "critical" and not e.get("cleared"),
                      at, until)
        restarted = first(lambda e: e["kind"] == "run" and e["state"] == "restarting", at, until)
        began = first(lambda e: e["kind"] == "run" and e["state"] == "running", at, until)
        if restarted is None and began is None:  # (none: replaced in place, if at all)
            restarted = first(lambda e: replaced(e, cleared=False), at, until)
            began = first(lambda e: replaced(e, cleared=True), at, until)
        # (a step of the driver that started after the fault, or after the new worker was up)
        trained = None if began is None else first(lambda e: e["kind"] == "metrics", at + began, until)
        out.append([named, restarted, None if trained is None else round(trained + began, 1)])
    return out


def measure(arm: Arm, end: float) -> dict:
    events = arm.events()
    began = next(e["ts"] for e in events if e["kind"] == "run")
    back = recoveries(events, arm.faults, end)
    # each fault's stall: until a step again, or (none came) the next fault or the end
    stalls = [(at, at + r[2] if r[2] is not None else (arm.faults[i + 1][0] if i + 1 < len(arm.faults) else end))
              for i, ((at, _, _), r) in enumerate(zip(arm.faults, back, strict=True))]
    kept_s, kept, lost = kept_time(events, end, stalls)

    def recovered(stage: str) -> int:
        return sum(1 for e in events if e["kind"] == "action" and e.get("op") == "recover" and e["ok"]
                   and e["result"].get("stage") == stage)

    # rollouts and teacher workers its driver started again (by themselves, or stopped frozen by the policy)
    in_place = sum(1 for e in events if e["kind"] == "alert" and e["code"] == "restarted_by_driver"
                   and not e.get("cleared"))
    return {"arm": arm.name, "wall_s": round(end - began, 1), "kept_s": round(kept_s, 1),
            "ettr": round(kept_s / (end - began), 3), "steps_kept": kept, "steps_lost": lost,
            "faults": [[round(t - began, 1), k, w] for t, k, w in arm.faults],
            "policy_restarts": recovered("restart"), "policy_replacements": recovered("replace"),
            "replaced_in_place": in_place, "person_restarts": len(arm.answers), "recoveries": back,
            "measure": MEASURE}


def bench(plan: Plan, keep: bool = False) -> list[dict]:
    scratch = Path(tempfile.mkdtemp(prefix="gkd-ettr-"))
    cache = prepared_cache(scratch)
    arms = [Arm("policy", scratch / "policy"), Arm("person", scratch / "person")]
    threads = [threading.Thread(target=drive, args=(arm, arm.name == "policy", plan, cache), name=arm.name,
                                daemon=True) for arm in arms]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        end = time.time()
        return [measure(arm, end) for arm in arms]
    finally:
        for arm in arms:
            if arm.sup is not None:
                for p in arm.faults:  # a stopped process is let go, so that the run's end can kill it
                    pid = arm.pid(p[2])
                    if pid:
                        try:
                            os.kill(pid, signal.SIGCONT)
                        except ProcessLookupError:
                            pass
                arm.sup.kill()
        if keep:
            print(f"the arms' runs are kept in {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def remeasured(said: dict, scratch: Path) -> dict:
    """An arm of a record measured again, as ``measure`` measures now, from its run kept in ``scratch``."""
    run = next((scratch / said["arm"] / "runs").glob("*/events.jsonl")).parent
    arm = Arm(said["arm"], scratch / said["arm"], kept_run=run, answers=[0.0] * said["person_restarts"])
    began = next(e["ts"] for e in arm.events() if e["kind"] == "run")
    arm.faults = [(began + t, k, w) for t, k, w in said["faults"]]
    return measure(arm, began + said["wall_s"])


def render(records: list[dict]) -> str:
    lines = ["| when | minutes | seed | grace s | arm | ETTR | kept s / wall s | steps kept | lost | faults | restarts "
             "(workers replaced in place) | a fault to: its alert, the restart or replacement, a step again (s, median "
             "and range) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        for a in r["arms"]:
            kinds = ", ".join(f"{k}" for _, k, _ in a["faults"]) or "-"
            restarts = a["policy_restarts"] if a["arm"] == "policy" else a["person_restarts"]
            if a.get("replaced_in_place"):
                restarts = f"{restarts} ({a['replaced_in_place']})"
            lines.append(f"| {r['when']} | {r['minutes']:g} | {r['seed']} | {r.get('grace_s', 10):g} | {a['arm']} | "
                         f"**{a['ettr']:.3f}** | {a['kept_s']:.0f} / {a['wall_s']:.0f} | {a['steps_kept']} | "
                         f"{a['steps_lost']} | {kinds} | {restarts} | {spread(a.get('recoveries'))} |")
    return "\n".join(lines)


def spread(recoveries: list[list[float | None]] | None) -> str:
    """Each of the three times' median (min-max) over the faults it came for, ``-`` for one that never did."""
    if not recoveries:
        return "-"
    parts = []
    for i in range(3):
        xs = sorted(x[i] for x in recoveries if x[i] is not None)
        parts.append(f"{statistics.median(xs):.0f} ({xs[0]:.0f}-{xs[-1]:.0f})" if xs else "-")
    return " / ".join(parts)


def write_results(text: str, check: bool) -> bool:
    doc = RESULTS.read_text()
    head, sep, rest = doc.partition(MARKERS[0])
    _, sep2, tail = rest.partition(MARKERS[1])
    if not (sep and sep2):
        raise SystemExit(f"{RESULTS}: the markers {MARKERS} are missing")
    new = f"{head}{MARKERS[0]}\n{text}\n{MARKERS[1]}{tail}"
    if check:
        return new == doc
    RESULTS.write_text(new)
    return True


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--answer-min", type=float, default=30.0, help="the person answers this long after the alert")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="2 minutes, a freeze each, a person answering in 60 s")
    p.add_argument("--keep", action="store_true", help="keep the arms' run directories (their events, logs, reports)")
    p.add_argument("--remeasure", type=Path, metavar="DIR", help="the record's last hour measured again, as it is "
                   "measured now, from its runs kept in DIR (--keep)")
    p.add_argument("--render-only", action="store_true")
    p.add_argument("--check", action="store_true", help="with --render-only: fail when RESULTS.md is not the record")
    a = p.parse_args()
    records = [json.loads(line) for line in RECORD.read_text().splitlines()] if RECORD.exists() else []
    if a.remeasure:
        last = records[-1]
        last["arms"] = [remeasured(arm, a.remeasure) for arm in last["arms"]]
        RECORD.write_text("".join(json.dumps(r) + "\n" for r in records))
        write_results(render(records), check=False)
        for arm in last["arms"]:
            print(f"{arm['arm']:7s} ETTR {arm['ettr']:.3f}  kept {arm['kept_s']:.0f} s of {arm['wall_s']:.0f} s")
        return 0
    if a.render_only:
        ok = write_results(render(records), a.check)
        print("bench/RESULTS.md's ETTR table " + ("is the record's" if ok else "is NOT the record's"))
        return 0 if ok else 1
    if a.smoke:  # a freeze 15 s into the training, the policy's act 3 s after its alert, the person's in 60 s
        arms = bench(Plan(a.seed, 2.0, 60.0, (15.0, 20.0), grace_s=3.0, kinds=("freeze",)), a.keep)
    else:
        arms = bench(Plan(a.seed, a.minutes, a.answer_min * 60, (240.0, 360.0)), a.keep)
    for arm in arms:
        print(f"{arm['arm']:7s} ETTR {arm['ettr']:.3f}  kept {arm['kept_s']:.0f} s of {arm['wall_s']:.0f} s; "
              f"steps kept {arm['steps_kept']}, lost {arm['steps_lost']}; faults "
              f"{', '.join(f'{k}@{t:.0f}s' for t, k, _ in arm['faults']) or 'none'}; restarts by the policy "
              f"{arm['policy_restarts']}, by the person {arm['person_restarts']}; workers replaced in place "
              f"{arm['replaced_in_place']} (stopped by the policy {arm['policy_replacements']})")
    if a.smoke:
        assert all(arm["faults"] for arm in arms), "a fault did not land in the smoke's minutes"
        policy = arms[0]
        assert policy["policy_restarts"] + policy["policy_replacements"] >= 1, "the policy did not act on the freeze"
        return 0
    with RECORD.open("a") as f:
        f.write(json.dumps({"when": time.strftime("%Y-%m-%d"), "minutes": a.minutes, "seed": a.seed, "grace_s": GRACE_S,
                            "answer_min": a.answer_min, "cores": os.cpu_count(), "arms": arms}) + "\n")
    write_results(render([json.loads(line) for line in RECORD.read_text().splitlines()]), check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
