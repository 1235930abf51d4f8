"""The dashboard under a synthetic run: N workers at 1 Hz heartbeats plus bursts of 20 k events/s,
through a real supervisor, into a headless dashboard process. Prints a table.

    python bench/bench_dashboard.py [--workers 1024 4096] [--seconds 60]

Measured in the dashboard process: phase-change-to-screen latency (a probe worker changes phase
every 0.3-0.7 s with its emit time in the detail; the time is taken when the table renders its row),
CPU (percent of one core), RSS after 10 s, half-way and at the end (flat = no growth), and the
backlog: each second, how old the newest event it has applied is (a dashboard that falls behind
sees that age grow), and how often it had to re-snapshot because its SUB queue overflowed.
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
    from gkd_core.telemetry.subscriber import RunSubscriber
    from gkd_tui.sources.live import LiveSource
    from gkd_tui.widgets.workers_table import WorkersTable

    lat: list[float] = []
    rss: list[int] = []
    lag: list[float] = []
    newest = {"ts": 0.0}
    pump = RunSubscriber.pump

    def noted_pump(self, *args, **kwargs):
        applied = pump(self, *args, **kwargs)
        if applied:
            newest["ts"] = max(newest["ts"], applied[-1].ts)
        return applied

    RunSubscriber.pump = noted_pump
    seen = {"last": ""}
    render_line = WorkersTable.render_line

    def timed_render_line(self, y: int):
        """The table's own line renderer; when it draws the probe's row with a phase that is new
        on screen, the probe's emit time (in its detail) gives the latency."""
        strip = render_line(self, y)
        index = int(self.scroll_y) + y - 1
        if y and 0 <= index < len(self.order) and self.order[index] == "probe/0":
            detail = self._state.workers["probe/0"].detail
            if detail.startswith("t=") and detail != seen["last"]:
                seen["last"] = detail
                lat.append((time.monotonic_ns() - int(detail[2:])) / 1e6)
        return strip

    WorkersTable.render_line = timed_render_line

    app = GkdApp(LiveSource(Path(run)))

    def sample() -> None:
        rss.append(rss_bytes())
        if newest["ts"]:
            lag.append(time.time() - newest["ts"])

    async def run_it() -> None:
        async with app.run_test(size=(160, 48), headless=True) as pilot:
            app.set_interval(1.0, sample)
            Path(out + ".ready").write_text("1")
            cpu0, t0 = sum(os.times()[:2]), time.monotonic()
            await pilot.pause(seconds)
            cpu = (sum(os.times()[:2]) - cpu0) / (time.monotonic() - t0) * 100
            Path(out).write_text(json.dumps({"lat_ms": lat, "rss": rss, "cpu": cpu, "lag_s": lag,
                                             "resnapshots": app.source.sub.snapshots - 1}))
            app.source.stop()

    import asyncio

    asyncio.run(run_it())


def load(ingest: str, workers: int, seconds: float, burst_rate: int) -> int:
    """Heartbeats of ``workers`` workers at 1 Hz, a probe phase change every 0.3-0.7 s (after 2 s),
    and a 1 s burst of ``burst_rate`` phase events every 10 s. Returns how many events were sent."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.sndhwm = 1_000_000
    sock.connect(ingest)
    rnd = random.Random(0)
    phases = ["generate", "teacher_wait", "train", "sync_weights", "idle"]
    for i in range(workers):
        sock.send(ev.encode(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"node-{i // 8}",
                                           pid=10_000 + i, gpus=[i % 8], ts=time.time())))
    sent, start = workers, time.monotonic()
    # probes start once the dashboard has taken in the registrations, and come at irregular
    # intervals, so they do not keep the same phase against its redraw timer
    next_probe = start + 2.0
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
            next_probe += rnd.uniform(0.3, 0.7)
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
    lat, rss, lag = res["lat_ms"], res["rss"], res["lag_s"][3:-2]  # not the seconds after the load has stopped
    return {"workers": workers, "sent": sent, "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat or [0]),
            "probes": len(lat), "cpu": res["cpu"], "rss0": rss[min(10, len(rss) - 1)] / 2**20,
            "rss_mid": rss[len(rss) // 2] / 2**20, "rss1": rss[-1] / 2**20, "lag_max": max(lag or [0]),
            "lag_end": max(lag[-10:] or [0]), "resnapshots": res["resnapshots"]}


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
    print(f"{'workers':>8} {'events sent':>12} {'latency p50':>12} {'p99':>7} {'max':>7} {'CPU':>5} "
          f"{'RSS 10s':>8} {'mid':>6} {'end':>6} {'lag max':>8} {'last 10s':>9} {'resnaps':>8}")
    for r in rows:
        print(f"{r['workers']:8d} {r['sent']:12d} {r['p50']:10.0f}ms {r['p99']:5.0f}ms {r['max']:5.0f}ms "
              f"{r['cpu']:4.0f}% {r['rss0']:6.0f}MB {r['rss_mid']:4.0f}MB {r['rss1']:4.0f}MB "
              f"{r['lag_max']:7.2f}s {r['lag_end']:8.2f}s {r['resnapshots']:8d}")
    print(f"\n{a.seconds:g} s per size, a {a.burst} events/s burst 1 s in every 10; {os.cpu_count()} cores; "
          "targets: p99 <= 250 ms, CPU <= 50 % of a core, RSS flat, lag not growing, no resnapshots")


if __name__ == "__main__":
    main()
