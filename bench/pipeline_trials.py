"""A stalled pipeline at random moments: each cause, many times, and what is named first; and the healthy time
before each stall, to count the alarms nothing explains.

    python bench/pipeline_trials.py [--trials 20] [--causes server tool rank gate] [--shapes async slime]
                                    [--seed 1] [--record bench/pipeline_trials.jsonl]
    python bench/pipeline_trials.py --render-only [--check]
    python bench/pipeline_trials.py --smoke     # one trial, into a scratch record (CI)

A trial is one run of tests/jobs/ray_async_pipeline.py under `gkd-tui launch --` (a plain Ray job: an
inference server in a Ray actor, a tool outside Ray, a rollouter behind a staleness gate, a message queue,
two trainer ranks over gloo; ``slime``: the rollouter and the queue one threaded actor fed by a thread of its
own), healthy for a time drawn from the trial's own seed (``HEALTHY_S``), then stalled by its cause: the
server's handler never returns, the tool never answers, a rank never joins the all-reduce, the gate never
gets the new version. From ``events.jsonl`` alone:

- **named**: the first warning or critical alert after the stall; right when its code and the worker it
  names are the cause's (tests/pipeline_stalls.py ``CAUSES``, ``SLIME_CAUSES``), and told apart as the
  diagnosis's (the supervisor's rules) or the job's own report (none of these jobs sends alerts);
- **after**: seconds from the stall to it; the goal is 15 s (``WINDOW_S`` waits 20);
- **false alarms**: any warning or critical alert before the stall, over the healthy time of every trial
  (its launch to its stall: at least as long as the stalled time watched).

The record (``--record``, JSON lines) gets a row per trial as it ends; ``--render-only`` renders the whole
record into bench/pipeline_trials.md, and ``--check`` fails when that file is not the record's.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import gkd_tui, logged_events  # noqa: E402
from pipeline_stalls import CAUSES, SLIME_CAUSES, said  # noqa: E402

JOB = ROOT / "tests" / "jobs" / "ray_async_pipeline.py"
RUNNER = 1  # the record's format
HEALTHY_S = (10.0, 40.0)  # the healthy time before a stall, drawn per trial
WINDOW_S = 20.0  # a trial waits this long after its stall for a naming
START_S = 150.0  # for the job to start and reach its stall
GOAL = {"precision": 0.95, "recall": 0.95, "p90_s": 15.0}
TABLE = ROOT / "bench" / "pipeline_trials.md"
RECORD = ROOT / "bench" / "pipeline_trials.jsonl"


def trial(shape: str, cause: str, seed: int) -> dict:
    """One trial in a GKD_HOME of its own: the row of the record."""
    healthy_s = round(random.Random(seed).uniform(*HEALTHY_S), 1)
    code, culprit, _ = (SLIME_CAUSES if shape == "slime" else CAUSES)[cause]
    row = {"runner": RUNNER, "shape": shape, "cause": cause, "seed": seed, "healthy_s": healthy_s, "commit": _commit()}
    with tempfile.TemporaryDirectory(prefix="gkd-pipeline-") as home:
        os.environ["GKD_HOME"] = home
        args = ["--slime"] if shape == "slime" else []
        launched_at = time.time()
        got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), str(healthy_s), cause,
                      *args, home=Path(home))
        if got.returncode != 0:
            return {**row, "error": f"launch failed: {got.stderr.strip()[-300:]}"}
        run = next((Path(home) / "runs").iterdir())
        try:
            stalled = _wait(lambda: said(run, "STALLED AT"), START_S + healthy_s)
            if stalled is None:
                return {**row, "error": "the job did not reach its stall"}
            stalled_at = float(stalled)
            named = _wait(lambda: _alarms(run, after=stalled_at), WINDOW_S, every_s=0.25)
            time.sleep(0.5)  # (the naming's pass ends; nothing more is waited for)
            alarms = _alarms(run)
        finally:
            gkd_tui("stop", str(run), home=Path(home))
            time.sleep(0.5)
    before = [a for a in alarms if a["ts"] < stalled_at]
    first = named[0] if named else None
    return {**row, "healthy_watch_s": round(stalled_at - launched_at, 1),
            "false_alarms": [[a["code"], a["targets"], round(a["ts"] - launched_at, 1)] for a in before],
            "named": None if first is None else {"code": first["code"], "targets": first["targets"],
                                                 "severity": first["severity"], "by": _by(first),
                                                 "after_s": round(first["ts"] - stalled_at, 2)},
            "right": first is not None and first["code"] == code and first["targets"][:1] != []
            and first["targets"][0].startswith(culprit)}


def _alarms(run: Path, after: float = 0.0) -> list[dict]:
    log = run / "events.jsonl"
    if not log.exists():
        return []
    return [e for e in logged_events(run) if e["kind"] == "alert" and not e.get("cleared")
            and e.get("severity") in ("warn", "critical") and e["ts"] >= after]


def _by(alert: dict) -> str:
    """The diagnosis (the supervisor's rules) or the job's own report."""
    return "diagnosis" if alert.get("src") == "supervisor" else "job"


def _wait(pred, timeout_s: float, every_s: float = 1.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every_s)
    return None


def _commit() -> str:
    got = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return got.stdout.strip()


def render(rows: list[dict]) -> str:
    """The matrix: per shape and cause, and overall; the diagnosis's own namings apart from the job's."""
    rows = [r for r in rows if r.get("runner") == RUNNER]
    out = ["# Pipeline trials", "",
           "Rendered from `bench/pipeline_trials.jsonl` by `python bench/pipeline_trials.py --render-only`; "
           "regenerate after a run, never by hand. A trial: a plain Ray job of an async RL pipeline's shape "
           "under `gkd-tui launch --`, healthy for a random time, then stalled by its cause (see the script's "
           "docstring). Precision: the namings that are right; recall: the stalls named right within "
           f"{GOAL['p90_s']:.0f} s; times from the stall to the naming; false alarms: any warning or critical "
           "alert in the healthy time before the stalls.", "",
           "| shape | cause | trials | named right | precision | recall | p50 s | p90 s | max s | by | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["shape"], r["cause"]), []).append(r)
    for (shape, cause), group in sorted(groups.items()):
        out.append(_line(shape, cause, group))
    if rows:
        out.append(_line("**all**", "", rows))
    healthy = sum(r.get("healthy_watch_s", 0.0) for r in rows if "error" not in r)
    stalled = sum(WINDOW_S for r in rows if "error" not in r)
    false = [(r["shape"], r["cause"], r["seed"], fa) for r in rows for fa in r.get("false_alarms", [])]
    out += ["", f"Healthy time watched: {healthy:.0f} s over {len(rows)} trials (stalled time watched: at most "
                f"{stalled:.0f} s); false alarms in it: {len(false)}."]
    out += [f"- {shape}/{cause} seed {seed}: {fa[0]} on {', '.join(fa[1])} at {fa[2]} s" for shape, cause, seed, fa
            in false[:20]]
    wrong = [r for r in rows if "error" not in r and not r["right"]]
    if wrong:
        out += ["", "Named wrong or not named:"]
        out += [f"- {r['shape']}/{r['cause']} seed {r['seed']}: " + (
            f"{r['named']['code']} on {', '.join(r['named']['targets'])} after {r['named']['after_s']} s"
            if r["named"] else "nothing named") for r in wrong[:20]]
    out += ["", f"Goal (#55): precision and recall ≥ {GOAL['precision']} each, p90 ≤ {GOAL['p90_s']:.0f} s, "
                "no false alarm. Commands: `python bench/pipeline_trials.py --trials 20` (the record's rows say "
                "their commit and seed)."]
    return "\n".join(out) + "\n"


def _line(shape: str, cause: str, group: list[dict]) -> str:
    done = [r for r in group if "error" not in r]
    named = [r for r in done if r["named"]]
    right = [r for r in named if r["right"]]
    in_time = [r for r in right if r["named"]["after_s"] <= GOAL["p90_s"]]
    times = sorted(r["named"]["after_s"] for r in right)
    by = sorted({r["named"]["by"] for r in right})
    precision = f"{len(right) / len(named):.2f}" if named else "-"
    recall = f"{len(in_time) / len(done):.2f}" if done else "-"
    return (f"| {shape} | {cause} | {len(group)} | {len(right)} | {precision} | {recall} | {_q(times, 0.5)} | "
            f"{_q(times, 0.9)} | {times[-1] if times else '-'} | {', '.join(by) or '-'} | {len(group) - len(done)} |")


def _q(values: list[float], q: float) -> str:
    if not values:
        return "-"
    return f"{values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]:.1f}"


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=20, help="trials per shape and cause")
    p.add_argument("--causes", nargs="+", default=list(CAUSES), choices=list(CAUSES))
    p.add_argument("--shapes", nargs="+", default=["async"], choices=["async", "slime"])
    p.add_argument("--seed", type=int, default=1, help="the first trial's seed (each trial takes the next)")
    p.add_argument("--record", type=Path, default=RECORD)
    p.add_argument("--render-only", action="store_true", help="render the record into bench/pipeline_trials.md")
    p.add_argument("--check", action="store_true", help="with --render-only: fail if the file is not the record's")
    p.add_argument("--smoke", action="store_true", help="one trial into a scratch record (CI)")
    a = p.parse_args()
    if a.render_only:
        text = render(_read(a.record))
        if a.check:
            if not TABLE.exists() or TABLE.read_text() != text:
                raise SystemExit(f"{TABLE.relative_to(ROOT)} is not {a.record.name} rendered: run "
                                 "`python bench/pipeline_trials.py --render-only`")
            print(f"{TABLE.relative_to(ROOT)}: the record's")
            return
        TABLE.write_text(text)
        print(f"{TABLE.relative_to(ROOT)} rendered from {len(_read(a.record))} rows")
        return
    if a.smoke:
        a.trials, a.causes, a.record = 1, ["tool"], Path(tempfile.mkdtemp(prefix="gkd-smoke-")) / "trials.jsonl"
    # the trials in a shuffled order (a cause's trials not all at one time of the machine's day)
    plan = [(shape, cause) for shape in a.shapes for cause in a.causes for _ in range(a.trials)]
    random.Random(a.seed).shuffle(plan)
    for i, (shape, cause) in enumerate(plan):
        started = time.monotonic()
        try:
            row = trial(shape, cause, a.seed + i)
        except Exception as e:  # the runner's own failure: on the record, and on with the next trial
            row = {"runner": RUNNER, "shape": shape, "cause": cause, "seed": a.seed + i,
                   "error": f"{type(e).__name__}: {e}"[:300]}
        with open(a.record, "a") as f:
            f.write(json.dumps(row) + "\n")
        named = row.get("named") or {}
        print(f"[{i + 1}/{len(plan)}] {shape}/{cause} seed {row['seed']}: "
              + (row["error"] if "error" in row else
                 f"{'right' if row['right'] else 'WRONG'} {named.get('code')} {named.get('targets')} after "
                 f"{named.get('after_s')} s; false alarms {len(row['false_alarms'])}")
              + f" ({time.monotonic() - started:.0f} s)", flush=True)
    if a.smoke:
        rows = _read(a.record)
        print(render(rows))
        if any("error" in r or not r["right"] for r in rows):
            raise SystemExit("the smoke's trial was not named right")


if __name__ == "__main__":
    main()
