"""Per-step time of the `one_step_off` scheduler against `sync`, on the default config.

Run: ``python bench/bench_scheduler.py [--steps 40] [k=v …]``. Both runs go through the real
supervisor and the real trainer, one after the other, sharing the cached teacher; the per-step
time is the median gap between consecutive `metrics` events after a warm-up.
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
    gaps = [b["ts"] - a["ts"] for a, b in zip(metrics[warm:], metrics[warm + 1:])]
    timing = {k: statistics.median(m["timing"][k] for m in metrics[warm:]) for k in metrics[-1]["timing"]}
    return {"step_s": statistics.median(gaps), "agreement": metrics[-1]["agreement"], "timing": timing}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
        home = Path(tmp)
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)  # reuse a prepared teacher
        res = {s: run(home, s, a.steps, a.overrides) for s in ("sync", "one_step_off")}
    base = res["sync"]["step_s"]
    print(f"{'scheduler':14s} {'s/step (median)':>16s} {'vs sync':>8s} {'final agreement':>16s}  phases (median s)")
    for name, r in res.items():
        phases = "  ".join(f"{k} {v:.3f}" for k, v in r["timing"].items())
        print(f"{name:14s} {r['step_s']:16.3f} {r['step_s'] / base:7.2f}x {r['agreement']:16.3f}  {phases}")
    print(f"\n{a.steps} steps each, {os.cpu_count()} cores; overrides: {' '.join(a.overrides) or '(none)'}")


if __name__ == "__main__":
    main()
