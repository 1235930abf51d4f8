"""Chaos at random moments: kill -9 or SIGSTOP of one process of a real run, many times, and who is named first.

    python bench/chaos_trials.py [--trials 20] [--kinds student rollout teacher proxy driver agent]
                                 [--seed 1] [--record bench/chaos_trials.jsonl] [--table bench/RESULTS.md]

One real run of the embedded demo (the real trainer, a local Ray cluster, a checkpoint every step) takes
every trial in turn. A trial draws, from its own recorded seed, the process (a student, a rollout, the
teacher's worker or proxy, the driver, the node agent), the fault (SIGKILL, or SIGSTOP held until it is
named or 15 s) and a moment: a random delay after a step ends, so that some land inside the weight
sync's broadcast (the phase the target was in is recorded). Then, from ``events.jsonl`` alone:

- **named first**: the first alert after the fault that names any worker; right when it names the
  process hit (the driver: an alert naming ``driver``). A miss records what was named instead.
- **after**: seconds from the fault to that alert.

Then the run is brought back (SIGCONT; or it recovers by itself; or ``gkd-tui restart`` resumes it from
its latest checkpoint) and the next trial begins at a later step. Each trial is a line of ``--record``
(JSON); ``--table`` renders every line of the record into the table between the markers of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import RunningSupervisor, wait_until  # noqa: E402
from test_chaos import SETTINGS, TRAINER, Chaos  # noqa: E402

KINDS = {"student": ["student/0"], "rollout": ["rollout/0", "rollout/1"], "teacher": ["teacher/0"],
         "proxy": ["teacher/proxy"], "driver": ["driver"], "agent": ["agent/"]}
NAME_WITHIN_S = 10.0  # the goal; a trial waits 15 s for the first naming before it counts a miss
QUIET_S = 8.0  # longer than any rule takes to say a fault (5 s), so a late finding is not the next trial's
MARK = ("<!-- random trials -->", "<!-- /random trials -->")


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


def first_named(chaos: Chaos, t0: float) -> dict | None:
    for e in chaos.events():
        if e["ts"] >= t0 and e["kind"] == "alert" and not e.get("cleared") and e.get("targets"):
            return e
    return None


def named_now(chaos: Chaos) -> list[str]:
    """The alerts that name a worker and hold now (not cleared)."""
    active: dict[tuple, str] = {}
    for e in chaos.events():
        if e["kind"] == "alert" and e.get("targets"):
            key = (e["code"], tuple(e["targets"]))
            if e.get("cleared"):
                active.pop(key, None)
            else:
                active[key] = f"{e['code']} {', '.join(e['targets'])}"
    return sorted(active.values())


def quiet(chaos: Chaos, for_s: float = QUIET_S) -> None:
    """Until no alert names a worker, for ``for_s``: the last fault's findings (some come seconds late) and a
    restart's (workers still starting) must not be taken for the next one's."""
    since = None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if named_now(chaos):
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= for_s:
            return
        time.sleep(0.3)
    raise TimeoutError(f"the run did not settle: {named_now(chaos)}")


def phase_of(chaos: Chaos, src: str, t0: float) -> str:
    return next((e["phase"] for e in reversed(chaos.events())
                 if e["kind"] == "phase" and e["src"].startswith(src) and e["ts"] <= t0), "?")


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
    resumed = wait_until(lambda: chaos.resumed_from(seq1), 240, "the restarted driver to resume", every_s=0.3)
    chaos.wait_step(resumed + 1, 240, "training to go on after the restart")
    return f"restarted from step {resumed}"


def trial(chaos: Chaos, seed: str, kind: str) -> dict:
    rng = random.Random(seed)
    src = rng.choice(KINDS[kind])
    fault = rng.choice(["kill", "stop"])
    delay = rng.uniform(0.0, 0.6)  # about a step of the demo: some land in the sync
    quiet(chaos)
    at = chaos.wait_step(chaos.step(), 240, "a step to end")
    time.sleep(delay)
    pid = chaos.pid(src)
    src = next(e["src"] for e in reversed(chaos.events()) if e["kind"] == "worker" and e["src"].startswith(src))
    seq0, t0, before = chaos.events()[-1]["seq"], time.time(), chaos.step()
    os.kill(pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    named = None
    deadline = time.monotonic() + NAME_WITHIN_S + 5
    while named is None and time.monotonic() < deadline:
        time.sleep(0.2)
        named = first_named(chaos, t0)
    row = {"seed": seed, "kind": kind, "target": src, "fault": fault, "at_step": at, "delay_s": round(delay, 3),
           "phase": phase_of(chaos, src, t0), "student_phase": phase_of(chaos, "student/0", t0),
           "named": named["targets"] if named else [],
           "code": named["code"] if named else "", "message": named["message"][:300] if named else "",
           "after_s": round(named["ts"] - t0, 2) if named else None}
    row["right"] = bool(named) and named["targets"] == [src] and row["after_s"] <= NAME_WITHIN_S
    t1 = time.time()
    row["recovery"] = bring_back(chaos, fault, pid, seq0, before)
    row["recovery_s"] = round(time.time() - t1, 1)
    return row


def in_sync(row: dict) -> bool:
    """The fault landed while the weight sync was under way: its target, or the student, in ``sync_weights``."""
    return "sync_weights" in (row["phase"], row.get("student_phase"))


def render(rows: list[dict]) -> str:
    lines = ["| kind | trials | kill / stop | in the sync | right one named first | time to name: median, max | "
             "misses |", "|---|---|---|---|---|---|---|"]
    for kind in KINDS:
        rs = [r for r in rows if r["kind"] == kind]
        if not rs:
            continue
        right = [r for r in rs if r["right"]]
        times = [r["after_s"] for r in right]
        misses = "; ".join(f"`{r['seed']}` {r['fault']} of {r['target']} in {r['phase']}: "
                           + (f"{r['code']} named {', '.join(r['named'])} after {r['after_s']} s" if r["named"]
                              else "nothing named in 15 s") for r in rs if not r["right"]) or "none"
        lines.append(f"| {kind} | {len(rs)} | {sum(r['fault'] == 'kill' for r in rs)} / "
                     f"{sum(r['fault'] == 'stop' for r in rs)} | {sum(in_sync(r) for r in rs)} | "
                     f"{len(right)} of {len(rs)} ({100 * len(right) / len(rs):.0f} %) | "
                     + (f"{statistics.median(times):.1f} s, {max(times):.1f} s" if times else "-") + f" | {misses} |")
    return "\n".join(lines)


def write_table(path: Path, rows: list[dict]) -> None:
    text = path.read_text()
    head, _, rest = text.partition(MARK[0])
    tail = rest.partition(MARK[1])[2] if rest else "\n"
    commands = ", ".join(sorted({f"`{r['command']}`" for r in rows}))
    body = f"{MARK[0]}\n{len(rows)} trials, by {commands}:\n\n{render(rows)}\n{MARK[1]}"
    path.write_text(head + body + tail)


def _interrupted(*_) -> None:
    """A SIGTERM (a time limit) ends it as Ctrl-C does: the run is stopped, the record kept."""
    raise KeyboardInterrupt


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=20, help="per kind")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    p.add_argument("--seed", default="1")
    p.add_argument("--record", default=str(ROOT / "bench" / "chaos_trials.jsonl"))
    p.add_argument("--table", default="", help="render the whole record into this file (bench/RESULTS.md), between its markers")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                   help="settings for the run beside the chaos suite's (a bigger model: a longer sync to land in)")
    p.add_argument("--render-only", action="store_true", help="no trials: only --table from the record")
    a = p.parse_args()
    record = Path(a.record)
    if a.render_only:
        rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
        write_table(Path(a.table), rows)
        return 0
    signal.signal(signal.SIGTERM, _interrupted)
    home = Path(tempfile.mkdtemp(prefix="gkd-chaos-"))
    os.environ["GKD_HOME"] = str(home)
    sup = RunningSupervisor(home, [*SETTINGS, *a.set, "--linger", "3600", "--driver", TRAINER], dict(os.environ))
    chaos = TailedRun(sup, home)
    order = [k for _ in range(a.trials) for k in a.kinds]
    try:
        chaos.wait_step(2, 300, "the run's first steps")
        for i, kind in enumerate(order):
            row = trial(chaos, f"{a.seed}/{i}", kind)
            row["command"] = "python bench/chaos_trials.py " + " ".join(sys.argv[1:])
            with record.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"{i + 1}/{len(order)} {row['fault']} {row['target']} ({row['phase']}): "
                  f"{'RIGHT' if row['right'] else 'MISS'} {row['code']} {row['named']} {row['after_s']} s; "
                  f"{row['recovery']}", flush=True)
    finally:
        chaos.gkd("stop", str(chaos.run))
        sup.kill()
    if a.table:
        rows = [json.loads(line) for line in record.read_text().splitlines() if line.strip()]
        write_table(Path(a.table), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
