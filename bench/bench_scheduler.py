"""Per-step time of the `one_step_off` scheduler against `sync`, on the default config.

Run: ``python bench/bench_scheduler.py [--steps 40] [k=v …]``. Both runs go through the real
supervisor and the real trainer, one after the other, sharing the cached teacher; the per-step
time is the median gap between consecutive `metrics` events after a warm-up. ``--smoke`` (for CI):
`sync` alone, 5 steps (the bench's code is the same for both runs, and each is half a minute of
start-up on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import records  # bench/records.py, beside this file

ROOT = Path(__file__).resolve().parent.parent


def run(home: Path, scheduler: str, steps: int, extra: list[str]) -> dict:
    env = dict(os.environ, GKD_HOME=str(home))
    run_id = f"bench-{scheduler}"
    subprocess.run([sys.executable, "-m", "gkd_core", "run", f"trainer.scheduler={scheduler}",
                    f"trainer.total_steps={steps}", "trainer.checkpoint_every=1000", *extra, "--run-id", run_id,
                    "--quiet"], env=env, cwd=ROOT, check=True, timeout=1200)
    events = [json.loads(line) for line in (home / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["kind"] == "metrics"]
    warm = max(3, steps // 5)
    gaps = [b["ts"] - a["ts"] for a, b in zip(metrics[warm:], metrics[warm + 1:], strict=False)]
    # the phases every step has (the evaluation, every trainer.eval_every steps, is left out)
    phases = [k for k in metrics[warm]["timing"] if all(k in m["timing"] for m in metrics[warm:])]
    timing = {k: statistics.median(m["timing"][k] for m in metrics[warm:]) for k in phases}
    return {"step_s": statistics.median(gaps), "agreement": metrics[-1]["agreement"], "timing": timing}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help="sync alone, 5 steps: for CI")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    if a.smoke:
        a.steps = 5  # the fewest with a step-to-step gap after the warm-up (3 steps)
    with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
        home = Path(tmp)
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)  # reuse a prepared teacher
        schedulers = ("sync",) if a.smoke else ("sync", "one_step_off")
        res = {s: run(home, s, a.steps, a.overrides) for s in schedulers}
    base = res["sync"]["step_s"]
    with records.kept("scheduler", smoke=a.smoke) as kept_run:
        print(f"{'scheduler':14s} {'s/step (median)':>16s} {'vs sync':>8s} {'final agreement':>16s}  phases (median s)")
        for name, r in res.items():
            phases = "  ".join(f"{k} {v:.3f}" for k, v in r["timing"].items())
            print(f"{name:14s} {r['step_s']:16.3f} {r['step_s'] / base:7.2f}x {r['agreement']:16.3f}  {phases}")
            kept_run.figure(f"{name}: a step", r["step_s"], " s")
        if "one_step_off" in res:
            kept_run.figure("one_step_off against sync", res["one_step_off"]["step_s"] / base, "x")
        print(f"\n{a.steps} steps each, {os.cpu_count()} cores; overrides: {' '.join(a.overrides) or '(none)'}")

if __name__ == "__main__":
    main()
