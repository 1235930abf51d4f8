"""Days of training, compressed: the default config for thousands of steps with each loss and each
scheduler, every process's memory sampled as it goes. Prints a table per run and a summary.

    python bench/bench_soak.py [--steps 3000] [--losses forward_kl reverse_kl jsd]
                               [--schedulers sync one_step_off] [--no-dashboard] [--json OUT]
    python bench/bench_soak.py --smoke   # for CI: one run of 20 steps (jsd, one_step_off), the dashboard attached

Each run is `python -m gkd_core run examples/tiny_cpu.yaml trainer.total_steps=N actor.loss=L
trainer.scheduler=S` in a fresh GKD_HOME, with a headless dashboard attached (the real app, a
live source) unless --no-dashboard. Every 2 s the bench reads the RSS of every process of the
run from /proc: the supervisor, the dashboard, and every process that registered (driver,
student, rollouts, teacher proxy and workers, node agent), and the step the run is at.

Per run: wall time, exit status, bad steps, the final evaluation's agreement and KL (what the
run's summary prints), each process's RSS at the start (its first sample once step 1 is
reported), the middle and the end, with the slope in MB per 1,000 steps fitted over the samples
from 10 % of the steps on (the first steps allocate: caches, the optimiser's state, Ray's pools),
events.jsonl bytes per step, heartbeat lines as a share of it, and checkpoint bytes on disk.
The bench fails if a run did not finish all its steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.__main__ import summary  # noqa: E402
from gkd_core.runlog.reader import replay  # noqa: E402

SAMPLE_S = 2.0
WARMUP = 0.10  # the share of the steps left out of the slope
SLOPE_LIMIT_MB = 5.0  # per 1,000 steps: what "flat" means here
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            resident = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None  # gone
    return resident * PAGE / 2**20 if resident else None  # 0: exited, not yet reaped (a zombie's statm)


def dashboard_main(run: str) -> None:
    """The real dashboard app, headless, attached until the run ends (or 2 h)."""
    import asyncio

    from gkd_tui.app import GkdApp
    from gkd_tui.sources.live import LiveSource

    app = GkdApp(LiveSource(Path(run)))

    async def run_it() -> None:
        async with app.run_test(size=(160, 48), headless=True) as pilot:
            deadline = time.monotonic() + 7200
            while time.monotonic() < deadline and app.source.state.state not in ("finished", "failed", "stopped"):
                await pilot.pause(1.0)
            app.source.stop()

    asyncio.run(run_it())


class LogTail:
    """The new complete lines of events.jsonl since the last read: the step and who has which pid."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0
        self.step = 0
        self.pids: dict[str, int] = {}
        self.state = ""

    def read(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].splitlines():
            if b'"kind":"heartbeat' in line:
                continue
            o = msgspec.json.decode(line)
            kind = o.get("kind")
            if kind == "worker" and o.get("pid"):
                self.pids[o["src"]] = o["pid"]
            elif kind == "metrics":
                self.step = max(self.step, o.get("step") or 0)
            elif kind == "run":
                self.state = o.get("state", "")


def fit_slope(points: list[tuple[int, float]]) -> float:
    """Least-squares MB per 1,000 steps."""
    if len(points) < 3:
        return float("nan")
    n = len(points)
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    return 1000 * sxy / sxx if sxx else float("nan")


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def soak(steps: int, loss: str, scheduler: str, dashboard: bool) -> dict:
    with tempfile.TemporaryDirectory(prefix="gkds") as tmp:
        home = Path(tmp)
        env = dict(os.environ, GKD_HOME=str(home))
        cache = Path(os.environ.get("GKD_HOME") or "~/.gkd").expanduser() / "cache"
        if cache.is_dir():
            (home / "cache").symlink_to(cache)  # reuse a prepared teacher
        run_id = f"soak-{loss}-{scheduler}"
        run = home / "runs" / run_id
        t0 = time.monotonic()
        sup = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "examples/tiny_cpu.yaml",
                                f"trainer.total_steps={steps}", f"actor.loss={loss}",
                                f"trainer.scheduler={scheduler}", "--run-id", run_id, "--quiet"],
                               env=env, cwd=ROOT, start_new_session=True)
        while not (run / "endpoints.json").exists():
            if sup.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError(f"{run_id}: the supervisor did not start (exit {sup.poll()})")
            time.sleep(0.1)
        procs = {"supervisor": sup.pid}
        dash = None
        if dashboard:
            dash = subprocess.Popen([sys.executable, __file__, "--dashboard", str(run)], cwd=ROOT, env=env,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            procs["dashboard"] = dash.pid
        tail = LogTail(run / "events.jsonl")
        samples: dict[str, list[tuple[int, float]]] = {}
        deadline = time.monotonic() + 600 + steps  # a run slower than a second a step is stuck: say so
        while sup.poll() is None:
            if time.monotonic() > deadline:
                os.killpg(sup.pid, signal.SIGKILL)
                raise RuntimeError(f"{run_id}: not finished within {600 + steps} s (step {tail.step}); "
                                   f"see {run / 'logs' / 'driver.log'}")
            tail.read()
            procs.update(tail.pids)
            if tail.step >= 1:
                for name, pid in procs.items():
                    mb = rss_mb(pid)
                    if mb is not None:
                        samples.setdefault(name, []).append((tail.step, mb))
            time.sleep(SAMPLE_S)
        wall = time.monotonic() - t0
        if dash is not None:
            try:
                dash.wait(60)
            except subprocess.TimeoutExpired:
                dash.kill()
        log = run / "events.jsonl"
        lines = log.read_bytes().splitlines()
        state = replay(lines)
        hb_bytes = sum(len(line) + 1 for line in lines if b'"kind":"heartbeat' in line)
        last_step = max((m.step for m in state.metrics), default=0)
        return {
            "loss": loss, "scheduler": scheduler, "steps": steps, "last_step": last_step, "exit": sup.returncode,
            "state": state.state, "wall_s": wall, "bad_steps": len(state.bad_steps),
            "summary": summary(state).lstrip("; "), "final": _final(state),
            "log_bytes": log.stat().st_size, "hb_bytes": hb_bytes, "log_lines": len(lines),
            "ckpt_bytes": du(run / "checkpoints"), "ckpts": len(list((run / "checkpoints").glob("step_*"))),
            "procs": {name: _trend(points, steps) for name, points in samples.items()},
        }


def _final(state) -> dict:
    ms = [m for m in state.metrics if m.agreement is not None]
    return {"agreement": ms[-1].agreement, "kl": ms[-1].kl} if ms else {}


def _trend(points: list[tuple[int, float]], steps: int) -> dict:
    def at(step: float) -> float:
        return min(points, key=lambda p: abs(p[0] - step))[1]
    settled = [p for p in points if p[0] >= WARMUP * steps]
    return {"start": points[0][1], "mid": at(steps / 2), "end": points[-1][1],
            "slope": fit_slope(settled), "samples": len(points)}


def print_run(r: dict) -> None:
    per_step = r["log_bytes"] / max(r["last_step"], 1)
    print(f"\n{r['loss']} / {r['scheduler']}: {r['state']} (exit {r['exit']}) at step {r['last_step']}/{r['steps']} "
          f"in {r['wall_s']:.0f} s, {r['bad_steps']} bad steps; {r['summary']}")
    print(f"  events.jsonl {r['log_bytes'] / 2**20:.1f} MB = {per_step / 1024:.2f} KB/step "
          f"({100 * r['hb_bytes'] / max(r['log_bytes'], 1):.0f} % heartbeats); "
          f"checkpoints {r['ckpts']} on disk, {r['ckpt_bytes'] / 2**20:.1f} MB")
    print(f"  {'process':<16} {'RSS start':>10} {'middle':>8} {'end':>8} {'MB/1k steps':>12}")
    for name, t in sorted(r["procs"].items()):
        flag = "  <- grows" if abs(t["slope"]) >= SLOPE_LIMIT_MB else ""  # nan (under 3 samples): not fitted
        print(f"  {name:<16} {t['start']:8.0f}MB {t['mid']:6.0f}MB {t['end']:6.0f}MB {t['slope']:+12.2f}{flag}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dashboard", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--losses", nargs="+", default=["forward_kl", "reverse_kl", "jsd"])
    p.add_argument("--schedulers", nargs="+", default=["sync", "one_step_off"])
    p.add_argument("--no-dashboard", action="store_true", help="no headless dashboard attached")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--smoke", action="store_true", help="one run of 20 steps (jsd, one_step_off), the dashboard "
                                                        "attached: for CI")
    a = p.parse_args()
    if a.dashboard:
        dashboard_main(a.dashboard)
        return
    if a.smoke:  # 20 steps: RSS sampled every 2 s a few times, two evaluations and checkpoints
        a.steps, a.losses, a.schedulers = 20, ["jsd"], ["one_step_off"]
    with records.kept("soak", smoke=a.smoke) as kept_run:
        runs = []
        for loss in a.losses:
            for scheduler in a.schedulers:
                r = soak(a.steps, loss, scheduler, not a.no_dashboard)
                print_run(r)
                runs.append(r)
                sys.stdout.flush()
        print(f"\n{'loss':<11} {'scheduler':<13} {'state':<9} {'wall':>6} {'bad':>4} {'agreement':>9} {'KL':>6} "
              f"{'KB/step':>8} {'ckpt MB':>8} {'worst RSS slope (MB/1k steps)':>30}")
        for r in runs:
            worst = max(r["procs"].items(),
                        key=lambda kv: abs(kv[1]["slope"]) if kv[1]["slope"] == kv[1]["slope"] else 0,
                        default=("no process sampled", {"slope": float("nan")}))
            f = r["final"]
            print(f"{r['loss']:<11} {r['scheduler']:<13} {r['state']:<9} {r['wall_s']:5.0f}s {r['bad_steps']:4d} "
                  f"{100 * f.get('agreement', float('nan')):8.1f}% {f.get('kl', float('nan')):6.3f} "
                  f"{r['log_bytes'] / max(r['last_step'], 1) / 1024:8.2f} {r['ckpt_bytes'] / 2**20:8.1f} "
                  f"{worst[1]['slope']:+20.2f} ({worst[0]})")
        print(f"\n{a.steps} steps per run, default config; {os.cpu_count()} cores; RSS sampled every {SAMPLE_S:g} s, "
              f"slope fitted from {100 * WARMUP:.0f} % of the steps on; "
              f"flat: under {SLOPE_LIMIT_MB:g} MB per 1,000 steps")
        for r in runs:
            worst = max((abs(t["slope"]) for t in r["procs"].values() if t["slope"] == t["slope"]), default=None)
            if worst is not None:
                kept_run.figure(f"{r['loss']} / {r['scheduler']}: the steepest RSS slope", worst, " MB per 1k steps")
    if a.json:
        Path(a.json).write_text(json.dumps(runs, indent=1))
    unfinished = [f"{r['loss']}/{r['scheduler']}: {r['state']} (exit {r['exit']}) at step {r['last_step']}"
                  for r in runs if r["exit"] != 0 or r["last_step"] < r["steps"]]
    if unfinished:
        sys.exit(f"bench_soak: runs that did not finish their {a.steps} steps: {'; '.join(unfinished)}")


if __name__ == "__main__":
    main()
