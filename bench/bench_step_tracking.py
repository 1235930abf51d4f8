"""What tracking collectives costs a training step: the real trainer with it off and on, in one run.

    python bench/bench_step_tracking.py [--rounds 3] [--steps 40] [k=v …]

Each round runs the real trainer twice through the real supervisor (a local Ray cluster, the embedded
demo unless ``k=v`` says otherwise), once with ``GKD_COLLECTIVES=0`` (our wrapper records nothing, the
Flight Recorder is off and not read) and once as every run is (the wrapper around the weight sync's
broadcast, the recorder on with 2,000 entries, a ``collectives`` event at each change); which goes
first alternates round by round. A run's step time is the median gap between consecutive ``metrics``
events after a warm-up; the table gives, per way, the median of the rounds with min and max, and the
``collectives`` events each run sent (0 with it off: the switch did switch it off; the bench fails if it
did not, or if tracking on sent none). ``--smoke``: one round of 5 steps, for CI.
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
WAYS = {"off": {"GKD_COLLECTIVES": "0"}, "on": {}}


def run(home: Path, run_id: str, way: str, steps: int, extra: list[str]) -> dict:
    env = dict(os.environ, GKD_HOME=str(home), **WAYS[way])
    env.pop("TORCH_FR_BUFFER_SIZE", None)  # the run's own default for each way
    subprocess.run([sys.executable, "-m", "gkd_core", "run", f"trainer.total_steps={steps}",
                    "trainer.checkpoint_every=1000", *extra, "--run-id", run_id, "--quiet"],
                   env=env, cwd=ROOT, check=True, timeout=1200)
    events = [json.loads(line) for line in (home / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["kind"] == "metrics"]
    warm = max(3, steps // 5)
    gaps = [b["ts"] - a["ts"] for a, b in zip(metrics[warm:], metrics[warm + 1:], strict=False)]
    return {"step_s": statistics.median(gaps), "sync_s": statistics.median(m["timing"]["sync"] for m in metrics[warm:]),
            "collectives": sum(e["kind"] == "collectives" for e in events)}


def spread(xs: list[float], unit: float = 1.0) -> str:
    return f"{statistics.median(xs) * unit:.1f} ({min(xs) * unit:.1f}-{max(xs) * unit:.1f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--smoke", action="store_true", help="one round of 5 steps, for CI")
    p.add_argument("overrides", nargs="*")
    a = p.parse_args()
    if a.smoke:
        a.rounds, a.steps = 1, 5  # 5: the fewest with a step-to-step gap after the warm-up (3 steps)
    res: dict[str, list[dict]] = {w: [] for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
        home = Path(tmp)
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)  # reuse a prepared teacher
        for r in range(a.rounds):
            for way in (("off", "on") if r % 2 == 0 else ("on", "off")):
                res[way].append(run(home, f"bench-{way}-{r}", way, a.steps, a.overrides))
                print(f"round {r + 1}/{a.rounds} {way}: {res[way][-1]}", file=sys.stderr, flush=True)
    base = statistics.median(x["step_s"] for x in res["off"])
    with records.kept("step_tracking", smoke=a.smoke) as kept_run:
        print(f"{'tracking':10s} {'ms / step':>22s} {'vs off':>7s} {'ms in the sync':>22s} {'collectives events':>19s}")
        for way, rs in res.items():
            steps = [x["step_s"] for x in rs]
            print(f"{way:10s} {spread(steps, 1000):>22s} {statistics.median(steps) / base:6.3f}x "
                  f"{spread([x['sync_s'] for x in rs], 1000):>22s} {'/'.join(str(x['collectives']) for x in rs):>19s}")
        print(f"\n{a.rounds} rounds of {a.steps} steps each way, median (min-max) of the rounds; {os.cpu_count()} "
              f"cores, Python {sys.version.split()[0]}; overrides: {' '.join(a.overrides) or '(none)'}")
        kept_run.figure("a step with tracking on against off", statistics.median(x["step_s"] for x in res["on"]) / base,
                        "x")
    off = [x["collectives"] for x in res["off"]]
    on = [x["collectives"] for x in res["on"]]
    if any(off) or not all(on):
        sys.exit(f"bench_step_tracking: GKD_COLLECTIVES=0 did not switch tracking off, or tracking on sent nothing "
                 f"({off} collectives events with it off, {on} with it on); see gkd_core/telemetry/collectives.py")


if __name__ == "__main__":
    main()
