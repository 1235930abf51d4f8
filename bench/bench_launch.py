"""What launching the default demo costs and gives here: README's "What `gkd-tui launch` does" figures.

    python bench/bench_launch.py --rounds 3   # a first launch (a fresh GKD_HOME: the demo written out),
                                              # then 3 later ones
    python bench/bench_launch.py --smoke      # for CI: one launch of 3 steps (the demo cached where
                                              # GKD_HOME has it), nothing recorded

Each launch is `python -m gkd_core run` on the embedded default (no config, nothing set: what `gkd-tui launch`
starts), without the dashboard, whose drawing would share the cores. The first writes the built-in demo out
into a new GKD_HOME (the teacher trained there); the later ones find it cached. Per launch, from its events:
the wall time of the command, when its first step's metrics were written (from the command's start), and the
held-out agreement and KL(teacher‖student) of the evaluation before the first step and of the last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import records  # bench/records.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 900  # a launch of the default demo is a minute or two here; one still going after this is stuck


def launch(home: Path, run_id: str, overrides: list[str]) -> dict:
    """One `python -m gkd_core run`, and what its event log says of it."""
    env = dict(os.environ, GKD_HOME=str(home))
    t0 = time.time()
    subprocess.run([sys.executable, "-m", "gkd_core", "run", *overrides, "--run-id", run_id, "--quiet"],
                   env=env, cwd=ROOT, check=True, timeout=LIMIT_S)
    wall = time.time() - t0
    events = [json.loads(line) for line in (home / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["kind"] == "metrics"]
    evaluated = [e for e in metrics if e.get("agreement") is not None]
    first_step = next(e for e in metrics if e["step"] >= 1)
    if not evaluated:
        raise SystemExit(f"bench_launch: run {run_id} evaluated nothing: no agreement to show")
    return {"wall_s": wall, "first_step_s": first_step["ts"] - t0, "steps": metrics[-1]["step"],
            "agreement": (evaluated[0]["agreement"], evaluated[-1]["agreement"]),
            "kl": (evaluated[0].get("eval_kl"), evaluated[-1].get("eval_kl"))}


def row(what: str, r: dict) -> str:
    (a0, a1), (k0, k1) = r["agreement"], r["kl"]
    kl = f"{k0:.2f} -> {k1:.2f}" if k0 is not None and k1 is not None else "-"
    return (f"{what:34s} {r['wall_s']:8.1f} {r['first_step_s']:10.1f} {r['steps']:6d}  "
            f"{100 * a0:5.1f} % -> {100 * a1:5.1f} %  {kl}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="later launches, after the first")
    p.add_argument("--smoke", action="store_true",
                   help="one launch of 3 steps, the demo cached where GKD_HOME has it: for CI; nothing recorded")
    a = p.parse_args()
    overrides = ["trainer.total_steps=3"] if a.smoke else []
    rounds = 0 if a.smoke else a.rounds
    with tempfile.TemporaryDirectory(prefix="gkd-bench-launch-") as tmp:
        home = Path(tmp)  # fresh: the first launch writes the demo out here, the later ones find it
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        cached = a.smoke and cache.is_dir()
        if cached:
            (home / "cache").symlink_to(cache)  # CI's benches share one prepared teacher: seconds saved
        first = launch(home, "first", overrides)
        later = [launch(home, f"later-{i}", overrides) for i in range(1, rounds + 1)]
    with records.kept("launch", smoke=a.smoke) as kept_run:
        print(f"{'launch':34s} {'wall (s)':>8s} {'first step':>10s} {'steps':>6s}  agreement on held-out prompts  "
              "KL(teacher‖student) there")
        print(row("first (the demo cached: --smoke)" if cached else "first (the demo written out)", first))
        for i, r in enumerate(later, 1):
            print(row(f"later {i} (cached)", r))
        kept_run.figure("first launch: wall time", first["wall_s"], " s")
        kept_run.figure("first launch: its first step", first["first_step_s"], " s")
        if later:
            kept_run.figure(f"later launch: wall time (median of {len(later)})",
                            statistics.median(r["wall_s"] for r in later), " s")
            kept_run.figure(f"later launch: its first step (median of {len(later)})",
                            statistics.median(r["first_step_s"] for r in later), " s")
        newest = (later or [first])[-1]
        kept_run.figure("held-out agreement: before training", 100 * newest["agreement"][0], " %")
        kept_run.figure(f"held-out agreement: after step {newest['steps']}", 100 * newest["agreement"][1], " %")
        print(f"\n`python -m gkd_core run` on the embedded default{' (trainer.total_steps=3)' if a.smoke else ''}, "
              f"one after the other; {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
