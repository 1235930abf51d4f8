"""The dashboard under a synthetic run: N workers at 1 Hz heartbeats plus bursts of 20 k events/s,
through a real supervisor, into a headless dashboard process. Prints a table.

    python bench/bench_dashboard.py [--workers 1024 4096] [--seconds 60]

Measured in the dashboard process: phase-change-to-screen latency (a probe worker changes phase
every 0.5 s with its emit time in the detail; the time is taken when a redraw has rendered it),
CPU (percent of one core) and RSS at the start and the end (flat = no growth).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gkd_core.telemetry import events as ev  # noqa: E402


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else float("nan")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dashboard_main(run: str, out: str, seconds: float) -> None:
    """The headless dashboard, timing how long a probe's phase change takes to reach the screen."""
    from gkd_tui.app import GkdApp
    from gkd_tui.sources.live import LiveSource

    lat: list[float] = []
    rss: list[int] = []
    seen = {"last": ""}

    class Measured(GkdApp):
        def redraw(self) -> None:
            super().redraw()
            with self.source.lock:
                w = self.source.state.workers.get("probe/0")
                detail = w.detail if w else ""
            if detail.startswith("t=") and detail != seen["last"]:
                seen["last"] = detail
                lat.append((time.monotonic_ns() - int(detail[2:])) / 1e6)

    app = Measured(LiveSource(Path(run)))

    def sample() -> None:
        rss.append(rss_bytes())

    async def run_it() -> None:
        async with app.run_test(size=(160, 48), headless=True) as pilot:
            app.set_interval(1.0, sample)
            Path(out + ".ready").write_text("1")
            cpu0, t0 = sum(os.times()[:2]), time.monotonic()
            await pilot.pause(seconds)
            cpu = (sum(os.times()[:2]) - cpu0) / (time.monotonic() - t0) * 100
            Path(out).write_text(json.dumps({"lat_ms": lat, "rss": rss, "cpu": cpu}))
            app.source.stop()

    import asyncio

    asyncio.run(run_it())


def load(ingest: str, workers: int, seconds: float, burst_rate: int) -> int:
    """Heartbeats of ``workers`` workers at 1 Hz, a probe phase change every 0.5 s, and a 1 s burst of
    ``burst_rate`` phase events every 10 s. Returns how many events were sent."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.sndhwm = 1_000_000
    sock.connect(ingest)
    rnd = random.Random(0)
    phases = ["generate", "teacher_wait", "train", "sync_weights", "idle"]
    for i in range(workers):
        sock.send(ev.encode(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"node-{i // 8}",
                                           pid=10_000 + i, gpus=[i % 8], ts=time.time())))
    sent, start = workers, time.monotonic()
    next_probe = start
    beat = 0
    while (elapsed := time.monotonic() - start) < seconds:
        # heartbeats spread over the second, in 10 ms slices
        due = int(elapsed * workers)
        while beat < due:
            i = beat % workers
            sock.send(ev.encode(ev.HeartbeatEvent(src=f"rollout/{i}", phase="generate", elapsed=1.0, rss=1 << 30,
                                                  cpu=50.0, ts=time.time())))
            beat += 1
            sent += 1
        if int(elapsed) % 10 == 5:  # a burst second
            for _ in range(burst_rate // 100):
                i = rnd.randrange(workers)
                sock.send(ev.encode(ev.PhaseEvent(src=f"rollout/{i}", phase=rnd.choice(phases), step=int(elapsed),
                                                  ts=time.time())))
                sent += 1
        if time.monotonic() >= next_probe:
            sock.send(ev.encode(ev.PhaseEvent(src="probe/0", phase=rnd.choice(phases),
                                              detail=f"t={time.monotonic_ns()}", ts=time.time())))
            sent += 1
            next_probe += 0.5
        time.sleep(0.01)
    sock.close(linger=2000)
    return sent


def measure(workers: int, seconds: float, burst_rate: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="gkdd") as tmp:
        home = Path(tmp)
        env = dict(os.environ, GKD_HOME=str(home), GKD_DEMO_STEP_S="60")
        sup = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "trainer.total_steps=100000",
                                "--run-id", "bench", "--driver", "gkd_core.demo_driver", "--quiet"],
                               env=env, cwd=ROOT, start_new_session=True)
        run = home / "runs" / "bench"
        while not (run / "endpoints.json").exists():
            time.sleep(0.05)
        ingest = json.loads((run / "endpoints.json").read_text())["ingest"]
        out = str(home / "dash.json")
        dash = subprocess.Popen([sys.executable, __file__, "--dashboard", str(run), out, str(seconds)], cwd=ROOT,
                                env=env)
        while not Path(out + ".ready").exists():
            time.sleep(0.05)
        sent = load(ingest, workers, seconds - 1, burst_rate)
        dash.wait(seconds + 60)
        sup.terminate()
        sup.wait(30)
        res = json.loads(Path(out).read_text())
    lat, rss = res["lat_ms"], res["rss"]
    return {"workers": workers, "sent": sent, "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat or [0]),
            "probes": len(lat), "cpu": res["cpu"], "rss0": rss[min(2, len(rss) - 1)] / 2**20,
            "rss1": rss[-1] / 2**20}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dashboard", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--seconds", type=float, default=60)
    p.add_argument("--burst", type=int, default=20_000, help="events/s during a burst")
    a = p.parse_args()
    if a.dashboard:
        dashboard_main(a.dashboard[0], a.dashboard[1], float(a.dashboard[2]))
        return
    rows = [measure(n, a.seconds, a.burst) for n in a.workers]
    print(f"{'workers':>8} {'events sent':>12} {'latency p50':>12} {'p99':>9} {'max':>9} {'dashboard CPU':>14} "
          f"{'RSS start':>10} {'RSS end':>9}")
    for r in rows:
        print(f"{r['workers']:8d} {r['sent']:12d} {r['p50']:10.0f}ms {r['p99']:7.0f}ms {r['max']:7.0f}ms "
              f"{r['cpu']:13.0f}% {r['rss0']:8.0f}MB {r['rss1']:7.0f}MB")
    print(f"\n{a.seconds:g} s per size, a {a.burst} events/s burst 1 s in every 10; {os.cpu_count()} cores; "
          "targets: p99 <= 250 ms, CPU <= 50 %, RSS flat")


if __name__ == "__main__":
    main()
