"""Chaos at random moments: kill -9 or SIGSTOP of one process of a real run, many times, and who is named first;
and as long again of healthy running, to count the alarms no fault explains.

    python bench/chaos_trials.py [--trials 20] [--kinds student rollout teacher proxy driver agent]
                                 [--seed 1] [--record bench/chaos_trials.jsonl] [--table tests/chaos/CHAOS.md]
                                 [--set KEY=VALUE ...]
    python bench/chaos_trials.py --render-only [--check]
    python bench/chaos_trials.py --smoke     # one trial and its healthy window, into a scratch record (CI)

One real run of the embedded demo (the real trainer, a local Ray cluster, the chaos suite's settings:
tests/chaos/test_chaos.py ``SETTINGS``, the shipped checkpoint interval) takes every trial in turn. A trial
draws, from its own recorded seed, the process (a student, a rollout, the teacher's worker or proxy, the
driver, the node agent) and the fault (SIGKILL, or SIGSTOP held until it is named or the window ends); its
round gives the moment (``--moments``, in turn): a random delay after a step ends, or inside a weight sync:
armed for the student to send at the start of its next sync (gkd_core/trainer/faults.py ``arm``; a sync
lasts tens of milliseconds, which no watcher outside the run can aim at). Where it landed is read from the
log afterwards: the step, and the phase of the target and of the student at the signal. Then, from
``events.jsonl`` alone:

- **named**: the first naming after the fault (tests/chaos/chaos_naming.py: a critical alert, or the
  driver's word that it started the process again); right when the process hit is in its targets, and
  told apart as the diagnosis (a rule inferring it) or the driver's own report.
- **after**: seconds from the fault to that alert; the goal is 10 s (``WINDOW_S`` waits 15).

Each round of kinds is followed by a healthy window as long as the round's trials are watched (no fault):
every critical alert in it is a false alarm. Then the run is brought back (SIGCONT; or it recovers by
itself; or ``gkd-tui restart`` resumes it from its latest checkpoint) and the next trial begins.

The record (``--record``, JSON lines) is written as it goes: a line when a trial starts, and its row when it
ends, done, crashed (the runner's error) or cut (a time limit, Ctrl-C); a trial started with no end is one
the runner died in. ``--table`` (and ``--render-only``) renders the whole record into the fault matrix
between the markers of tests/chaos/CHAOS.md; ``--check`` fails when the file's table is not the record's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "chaos")]

from chaos_naming import criticals, first_naming, hits  # noqa: E402
from conftest import RunningSupervisor, wait_until  # noqa: E402
from test_chaos import NAME_WITHIN_S, SETTINGS, TRAINER, Chaos  # noqa: E402

from gkd_core.trainer.faults import ARMED, arm  # noqa: E402

RUNNER = 3  # the record's format and the diagnosis it ran against; older rows are left out, with why:
LEFT_OUT = {
    1: "It took the first alert of any severity as the naming and wrote a trial only once it ended (two of its three "
       "commands stopped early, at 8 and 33 of 120 trials, and nothing says why); its first 41 rows (seeds 25, 26) "
       "polled the whole log, which put the fault 9 to 195 steps from where it landed, and record no student phase.",
    2: "It ran against the diagnosis before a silence outside the sync was critical at 5 s (it was at the 10 s stall "
       "limit) and before a starting worker was judged against its set-up deadline.",
}
KINDS = {"student": ["student/0"], "rollout": ["rollout/0", "rollout/1"], "teacher": ["teacher/0"],
         "proxy": ["teacher/proxy"], "driver": ["driver"], "agent": ["agent/"]}
MOMENTS = ("after_step", "in_sync")
WINDOW_S = NAME_WITHIN_S + 5  # a trial waits this long for its naming; the healthy windows add up to as long
MARK = ("<!-- random trials -->", "<!-- /random trials -->")
TABLE = ROOT / "tests" / "chaos" / "CHAOS.md"
GOAL = {"precision": 0.97, "recall": 0.95, "p90_s": 6.0}


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


def bring_back(chaos: Chaos, fault: str, pid: int, seq0: int, done_before: int) -> str:
    """Until training goes on again: how."""
    if fault == "stop":
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


def fault_trial(chaos: Chaos, seed: str, kind: str, moment: str) -> dict:
    rng = random.Random(seed)
    src = rng.choice(KINDS[kind])
    fault = rng.choice(["kill", "stop"])
    delay = rng.uniform(0.0, 0.6)  # about a step of the demo
    chaos.quiet()
    chaos.wait_step(chaos.step(), 240, "a step to end")
    pid = chaos.pid(src)
    src = next(e["src"] for e in reversed(chaos.events()) if e["kind"] == "worker" and e["src"].startswith(src))
    seq0, before = chaos.events()[-1]["seq"], chaos.step()
    sig = signal.SIGKILL if fault == "kill" else signal.SIGSTOP
    if moment == "in_sync":
        # armed for the student to send at the start of its next sync: inside it, whoever the target is
        fired = arm(chaos.run, pid, sig)
        try:
            said = wait_until(lambda: fired.exists() and fired.read_text(), 60,
                              "the armed fault to fire in a weight sync", every_s=0.01)
        finally:  # not fired: disarmed, so that it does not fire in a later trial or a healthy window
            (chaos.run / ARMED).unlink(missing_ok=True)
        t0 = json.loads(said)["ts"]
    else:
        time.sleep(delay)
        t0 = time.time()
        os.kill(pid, sig)
    naming = None
    deadline = time.monotonic() + WINDOW_S
    while naming is None and time.monotonic() < deadline:
        time.sleep(0.2)
        naming = first_naming(chaos.events(), t0, src)
    time.sleep(0.2)  # the log is flushed every 100 ms: where it landed is read once the moment is written
    row = {"target": src, "fault": fault, "moment": moment, "delay_s": round(delay, 3) if moment == "after_step"
           else None, "at_step": step_at(chaos, t0), "phase": phase_of(chaos, src, t0),
           "student_phase": phase_of(chaos, "student/0", t0),
           # in_sync: armed for the student's next sync start (the older rows' were aimed from the live events)
           "aim": "armed" if moment == "in_sync" else "",
           "named": naming.targets if naming else [], "code": naming.code if naming else "",
           "severity": naming.severity if naming else "", "by": naming.by if naming else "",
           "message": naming.message[:300] if naming else "", "after_s": naming.after_s if naming else None}
    row["right"] = bool(naming) and naming.right and naming.after_s <= NAME_WITHIN_S
    t1 = time.time()
    row["recovery"] = bring_back(chaos, fault, pid, seq0, before)
    row["recovery_s"] = round(time.time() - t1, 1)
    return row


def healthy_window(chaos: Chaos, window_s: float) -> dict:
    """``window_s`` of the run left alone: every critical alert in it is a false alarm."""
    chaos.quiet()
    t0, before = time.time(), chaos.step()
    time.sleep(window_s)
    time.sleep(0.3)  # the window's last events flushed to the log
    events = chaos.events()
    alarms = criticals(events, t0, t0 + window_s)
    # warnings are no false alarms (nothing to act on yet), but are counted: a rule that warns in healthy running
    warned = Counter(e["code"] for e in events if t0 <= e["ts"] < t0 + window_s and e.get("kind") == "alert"
                     and not e.get("cleared") and e.get("severity") == "warn")
    return {"window_s": window_s, "steps": chaos.step() - before, "warnings": dict(warned),
            "alarms": [{"code": e["code"], "targets": e["targets"], "message": e.get("message", "")[:300],
                        "after_s": round(e["ts"] - t0, 2)} for e in alarms]}


# --- the table ---------------------------------------------------------------------------------------

def kind_of(src: str) -> str:
    """The kind of process a worker's ``src`` is: the kind an alert naming it predicts was hit."""
    if src == "teacher/proxy":
        return "proxy"
    role = src.split("/")[0]
    return {"student": "student", "rollout": "rollout", "teacher": "teacher", "driver": "driver",
            "agent": "agent"}.get(role, "other")


def nearest_rank(values: list[float], q: float) -> float:
    """The ``q`` quantile by nearest rank: a value that was measured (p90 of 20 is the 18th)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def trials_of(record: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """(the ended rows of this runner, those started and never ended well, the older runner's rows)."""
    old = [r for r in record if r.get("runner", 1) < RUNNER]
    ended: dict[tuple, dict] = {}
    started: dict[tuple, dict] = {}
    for r in record:
        if r.get("runner", 1) < RUNNER:
            continue
        key = (r["command"], r["seed"])
        (started if r["status"] == "started" else ended)[key] = r
    done = [r for r in ended.values() if r["status"] == "done"]
    unfinished = [r for r in ended.values() if r["status"] != "done"]
    unfinished += [dict(r, status="no end", error="the runner died in it (no word after its start)")
                   for k, r in started.items() if k not in ended]
    return done, unfinished, old


def f1(p: float | None, r: float | None) -> float | None:
    return 2 * p * r / (p + r) if p and r else (0.0 if p is not None and r is not None else None)


def number(x: float | None, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def spread(times: list[float], *quantiles: float) -> str:
    """The times' quantiles by nearest rank ("5.1 s, 5.8 s"), or "-" when there are none."""
    return ", ".join(f"{nearest_rank(times, q):.1f} s" for q in quantiles) if times else "-"


def render(record: list[dict]) -> str:
    done, unfinished, old = trials_of(record)
    faults = [r for r in done if r["kind"] != "healthy"]
    healthy = [r for r in done if r["kind"] == "healthy"]
    alarms = [(r, a) for r in healthy for a in r["alarms"]]
    warned = sum((Counter(r.get("warnings", {})) for r in healthy), Counter())
    commands = ", ".join(sorted({f"`{r['command']}`" for r in done + unfinished})) or "none"
    lines = [f"{len(done) + len(unfinished)} trials started, by {commands}: {len(faults)} faults and "
             f"{len(healthy)} healthy windows ended; {len(unfinished)} did not end (below)."]
    for runner, reason in LEFT_OUT.items():
        trials = {(r.get("command"), r["seed"]) for r in old if r.get("runner", 1) == runner}
        if trials:
            seeds = ", ".join(sorted({seed.split("/")[0] for _, seed in trials}))
            lines.append(f"Left out: the {len(trials)} trials of runner {runner} (`--seed` {seeds}). {reason}")
    # The diagnosis's own figures are the matrix: it infers the cause; the driver only reports what it did
    # (a worker it started again, a wait of its own that failed). A trial the driver reported first is the
    # driver's, set apart in its own columns and out of the diagnosis's recall and times (the record keeps
    # the first naming only, so whether the diagnosis would have named it too is not known).
    lines += ["", "| kind | trials | kill / stop | aimed into the sync / landed in it | the driver's reports first: "
              "right / all, p50 | the diagnosis's trials | right | wrong process | none in 10 s | precision | "
              "recall | F1 | time to name: p50, p90 |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    totals = {"right": 0, "on_target": 0, "predicted": 0, "trials": 0, "times": [], "reported": 0,
              "reported_right": 0, "report_times": []}
    for kind in KINDS:
        rs = [r for r in faults if r["kind"] == kind]
        reported = [r for r in rs if r["by"] == "driver"]
        mine = [r for r in rs if r["by"] != "driver"]
        # every naming of the diagnosis that predicts this kind: in any fault's trial, and every false alarm
        predicted = [r for r in faults if r["named"] and r["by"] != "driver" and kind_of(r["named"][0]) == kind]
        predicted_alarms = [a for _, a in alarms if a["targets"] and kind_of(a["targets"][0]) == kind]
        right = [r for r in mine if r["right"]]
        if not rs and not predicted and not predicted_alarms:
            continue
        n_pred = len(predicted) + len(predicted_alarms)
        # precision asks only "the right process?"; a right one named late is recall's miss
        on_target = [r for r in predicted if hits(r["named"], r["target"])]
        precision = len(on_target) / n_pred if n_pred else None
        recall = len(right) / len(mine) if mine else None
        times = [r["after_s"] for r in right]
        report_times = [r["after_s"] for r in reported if r["right"]]
        totals["right"] += len(right)
        totals["on_target"] += len(on_target)
        totals["predicted"] += n_pred
        totals["trials"] += len(mine)
        totals["times"] += times
        totals["reported"] += len(reported)
        totals["reported_right"] += len(report_times)
        totals["report_times"] += report_times
        wrong = [r for r in mine if r["named"] and not hits(r["named"], r["target"])]
        lines.append(
            f"| {kind} | {len(rs)} | "
            f"{sum(r['fault'] == 'kill' for r in rs)} / {sum(r['fault'] == 'stop' for r in rs)} | "
            f"{sum(r['moment'] == 'in_sync' for r in rs)} / {sum(in_sync(r) for r in rs)} | "
            f"{len(report_times)} / {len(reported)}, {spread(report_times, 0.5)} | {len(mine)} | {len(right)} | "
            f"{len(wrong)} | {len(mine) - len(right) - len(wrong)} | {number(precision)} | {number(recall)} | "
            f"{number(f1(precision, recall))} | {spread(times, 0.5, 0.9)} |")
    other = [a for _, a in alarms if not a["targets"] or kind_of(a["targets"][0]) == "other"]
    totals["predicted"] += len(other)
    p = totals["on_target"] / totals["predicted"] if totals["predicted"] else None
    r = totals["right"] / totals["trials"] if totals["trials"] else None
    times = totals["times"]
    lines.append(f"| **all** | {len(faults)} | | | {totals['reported_right']} / {totals['reported']}, "
                 f"{spread(totals['report_times'], 0.5)} | {totals['trials']} | {totals['right']} | | | "
                 f"**{number(p)}** | **{number(r)}** | **{number(f1(p, r))}** | **{spread(times, 0.5, 0.9)}** |")
    minutes = sum(h["window_s"] for h in healthy) / 60
    lines += ["", f"Healthy running: {len(healthy)} windows, {minutes:.1f} min, {sum(h['steps'] for h in healthy)} "
              f"steps; false alarms (a critical alert with no fault): {len(alarms)}"
              + (f" ({len(other)} naming no process of a kind above)" if other else "") + "; warnings: "
              + (", ".join(f"{code} {n}" for code, n in sorted(warned.items())) or "none") + ".",
              f"The goal, for the diagnosis's own namings (the driver's reports apart): precision ≥ "
              f"{GOAL['precision']}, recall ≥ {GOAL['recall']}, p90 time to name ≤ {GOAL['p90_s']:g} s (Minder, "
              "diagnosis only: precision 0.904, F1 0.893, a mean of 3.6 s; Mycroft: ≤ 15 s in 90 %). "
              + ("Here: " + ("met." if p is not None and r is not None and times and p >= GOAL["precision"]
                             and r >= GOAL["recall"] and nearest_rank(times, 0.9) <= GOAL["p90_s"] else "not met.")
                 if faults else ""), ""]
    misses = [r for r in faults if not r["right"]]
    lines.append("Misses (each named with why):" if misses else "Misses: none.")
    for m in misses:
        what = (f"{m['code']} named {', '.join(m['named'])} after {m['after_s']} s: {m['message'][:160]}"
                if m["named"] else f"nothing named in {WINDOW_S:g} s")
        lines.append(f"- `{m['seed']}` {m['fault']} of {m['target']} ({m['moment']}, in {m['phase']}; student in "
                     f"{m['student_phase']}): {what}")
    lines.append("False alarms:" if alarms else "False alarms: none.")
    for h, a in alarms:
        lines.append(f"- `{h['seed']}` {a['code']} on {', '.join(a['targets']) or 'nobody'}, {a['after_s']} s into "
                     f"the window: {a['message'][:160]}")
    lines.append("Trials that did not end:" if unfinished else "Trials that did not end: none.")
    for u in unfinished:
        lines.append(f"- `{u['seed']}` {u['kind']}: {u['status']}: {u.get('error', '')[:200]}")
    return "\n".join(lines)


def in_sync(row: dict) -> bool:
    """The fault landed while the weight sync was under way: its target, or the student, in ``sync_weights``."""
    return "sync_weights" in (row["phase"], row.get("student_phase"))


def block(record: list[dict]) -> str:
    return f"{MARK[0]}\n{render(record)}\n{MARK[1]}"


def table_in(text: str) -> str:
    """The block between the markers, markers included, or ""."""
    head, found, rest = text.partition(MARK[0])
    return found + rest.partition(MARK[1])[0] + MARK[1] if found else ""


def write_table(path: Path, record: list[dict]) -> None:
    text = path.read_text()
    old = table_in(text)
    path.write_text(text.replace(old, block(record)) if old
                    else text.rstrip("\n") + "\n\n## Random trials\n\n" + block(record) + "\n")


def read_record(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    home = Path(tempfile.mkdtemp(prefix="gkd-chaos-"))
    os.environ["GKD_HOME"] = str(home)
    sup = RunningSupervisor(home, [*SETTINGS, *a.set, "--linger", "3600", "--driver", TRAINER], dict(os.environ))
    chaos = TailedRun(sup, home)
    healthy_s = len(a.kinds) * WINDOW_S  # a round's faults are watched this long: as long again healthy
    order = [k for _ in range(a.trials) for k in [*a.kinds, "healthy"]]
    per_round = len(a.kinds) + 1  # a round: a fault of each kind, then a healthy window
    try:
        chaos.wait_step(2, 300, "the run's first steps")
        for i, kind in enumerate(order):
            head = {"runner": RUNNER, "command": command, "seed": f"{a.seed}/{i}", "kind": kind}
            append(record, {**head, "status": "started", "ts": round(time.time(), 3)})
            try:
                row = (healthy_window(chaos, healthy_s) if kind == "healthy"
                       else fault_trial(chaos, head["seed"], kind, a.moments[(i // per_round) % len(a.moments)]))
            except KeyboardInterrupt:
                append(record, {**head, "status": "cut", "error": "stopped by a time limit or Ctrl-C"})
                raise
            except Exception as exc:
                append(record, {**head, "status": "crashed", "error": f"{type(exc).__name__}: {exc}"[:500]})
                raise
            append(record, {**head, **row, "status": "done"})
            print(f"{i + 1}/{len(order)} {kind}: " + (
                f"{len(row['alarms'])} false alarm(s) in {healthy_s:g} s" if kind == "healthy" else
                f"{row['fault']} {row['target']} ({row['moment']}, {row['phase']}): "
                f"{'RIGHT' if row['right'] else 'MISS'} {row['code']} {row['named']} {row['after_s']} s; "
                f"{row['recovery']}"), flush=True)
    finally:
        chaos.gkd("stop", str(chaos.run))
        sup.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=20, help="per kind (and as many healthy windows)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
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
                   help="one real trial (a killed teacher) and its healthy window, into a record and table of its own")
    a = p.parse_args()
    record, table = Path(a.record), Path(a.table)
    if a.smoke:  # the same code path, on the smallest size; the committed record and table are left alone
        scratch = Path(tempfile.mkdtemp(prefix="gkd-chaos-smoke-"))
        record, table = scratch / "trials.jsonl", scratch / "CHAOS.md"
        table.write_text("# smoke\n")
        a.trials, a.kinds, a.seed, a.moments = 1, ["teacher"], "smoke", ["in_sync"]  # the armed path
    if a.render_only:
        rendered = block(read_record(record))
        if a.check:
            if table_in(table.read_text()) != rendered:
                print(f"{shown(table)}: its random trials' table is not what {shown(record)} renders; run "
                      f"`python bench/chaos_trials.py --render-only` and commit the result", file=sys.stderr)
                return 1
            print(f"{shown(table)}: the random trials' table is the record's ({len(read_record(record))} lines)")
            return 0
        write_table(table, read_record(record))
        return 0
    signal.signal(signal.SIGTERM, _interrupted)
    try:
        run_trials(a, record, "python bench/chaos_trials.py " + " ".join(sys.argv[1:]))
    finally:
        write_table(table, read_record(record))
    if a.smoke:
        done, unfinished, _ = trials_of(read_record(record))
        print(table_in(table.read_text()))
        if len(done) != 2 or unfinished or not done[0]["right"]:
            print("smoke: the trial did not name the killed teacher, or did not end", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
