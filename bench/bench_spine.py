"""Benchmarks of the telemetry spine; prints a table. Run: ``python bench/bench_spine.py``.

1. the reducer: events/s applied by ``RunState.apply`` (and with JSON decoding), against a
   plain dict-update reducer as the floor of what Python can do;
2. ``Reporter.emit``: µs per call, p50/p99, against a blocking ``PUSH.send`` of the same frames;
3. latency from ``emit`` in this process to ``apply`` in a subscriber process, through a real
   supervisor, at 1 k and 50 k events/s (p50/p99, and how many arrived);
4. the supervisor's CPU (percent of one core) while it takes 1 k events/s.

``--smoke`` (for CI): the same four on 3,000 events, 1 s at 1 k and 5 k events/s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.state import RunState  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402
from gkd_core.telemetry import wire  # noqa: E402
from gkd_core.telemetry.reporter import Reporter  # noqa: E402


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q / 100 * len(values)))]


def mixed_events(n: int, workers: int = 256) -> list[ev.Event]:
    """A run's traffic: mostly heartbeats, then phases, some sync/teacher/metrics/gpu."""
    rnd = random.Random(0)
    phases = ["generate", "teacher_wait", "train", "sync_weights", "idle"]
    out: list[ev.Event] = []
    for i in range(n):
        src = f"rollout/{rnd.randrange(workers)}"
        r = rnd.random()
        ts = 1000.0 + i * 1e-3
        if r < 0.70:
            e = ev.HeartbeatEvent(src=src, phase=rnd.choice(phases), elapsed=1.0, rss=1 << 30, cpu=50.0)
        elif r < 0.90:
            e = ev.PhaseEvent(src=src, phase=rnd.choice(phases), step=i // 1000)
        elif r < 0.94:
            e = ev.SyncEvent(src="driver", sync_id=i // 1000, state="progress", timeout_s=60, elapsed_s=1.0,
                             pending=[src])
        elif r < 0.97:
            e = ev.TeacherEvent(src="driver", side="client", sent=i, completed=i, latency_ms={"p50": 1.0})
        elif r < 0.99:
            e = ev.GpuEvent(src="agent/n0", node="n0", index=rnd.randrange(8), util=50.0, mem_used=1, mem_total=2)
        else:
            e = ev.MetricsEvent(src="driver", step=i // 1000, loss=1.0, kl=0.5, agreement=0.5)
        e.seq, e.ts, e.run = i + 1, ts, "bench"
        out.append(e)
    return out


def bench_reducer(n: int = 300_000) -> list[tuple[str, str, str]]:
    events = mixed_events(n)
    lines = [wire.encode(e) for e in events]
    st = RunState()
    t0 = time.perf_counter()
    for e in events:
        st.apply(e)
    apply_rate = n / (time.perf_counter() - t0)
    st = RunState()
    t0 = time.perf_counter()
    for line in lines:
        st.apply(wire.decode(line))
    full_rate = n / (time.perf_counter() - t0)
    # the floor: the cheapest reducer imaginable, one dict write per event
    floor: dict[str, float] = {}
    t0 = time.perf_counter()
    for e in events:
        floor[e.src] = e.ts
    floor_rate = n / (time.perf_counter() - t0)
    return [
        ("reducer: RunState.apply", f"{apply_rate / 1e3:,.0f} k events/s",
         f"{apply_rate / floor_rate:.2f}x of a bare dict write"),
        ("reducer: decode + apply", f"{full_rate / 1e3:,.0f} k events/s",
         f"{full_rate / apply_rate:.2f}x of apply alone"),
        ("reducer: bare dict write (floor)", f"{floor_rate / 1e3:,.0f} k events/s", "1.00x"),
    ]


def bench_emit(n: int = 100_000) -> list[tuple[str, str, str]]:
    ctx = zmq.Context.instance()
    pull = ctx.socket(zmq.PULL)
    pull.rcvhwm = 0
    pull.bind("tcp://127.0.0.1:*")
    addr = pull.last_endpoint.decode()
    drained = [0]
    import threading

    stop = threading.Event()

    def drain():
        while not stop.is_set():
            if pull.poll(50):
                while True:
                    try:
                        pull.recv_multipart(zmq.NOBLOCK)
                        drained[0] += 1
                    except zmq.Again:
                        break

    t = threading.Thread(target=drain, daemon=True)
    t.start()
    rep = Reporter("rollout/0", ingest=addr, heartbeat_s=1.0, queue_max=n + 10)
    samples = []
    clock = time.perf_counter_ns
    for i in range(n):
        e = ev.PhaseEvent(phase="generate", step=i)
        t0 = clock()
        rep.emit(e)
        samples.append((clock() - t0) / 1e3)
        if i % 64 == 0:
            time.sleep(0)  # let the sender thread run, as a real worker's main loop would
    rep.close(timeout_s=5)
    # the alternative: send on a PUSH socket from the caller's own thread
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    push.connect(addr)
    direct = []
    for i in range(n):
        e = ev.PhaseEvent(phase="generate", step=i, src="x", ts=time.time())
        t0 = clock()
        push.send_multipart(wire.frames(e))
        direct.append((clock() - t0) / 1e3)
    push.close()
    time.sleep(0.5)
    stop.set()
    t.join()
    pull.close()
    p50, p99 = pct(samples, 50), pct(samples, 99)
    d50, d99 = pct(direct, 50), pct(direct, 99)
    return [
        ("Reporter.emit", f"p50 {p50:.2f} µs  p99 {p99:.2f} µs", f"dropped {rep.dropped} of {n}"),
        ("encode + PUSH.send in caller (blocking)", f"p50 {d50:.2f} µs  p99 {d99:.2f} µs",
         f"emit/send p50 {p50 / d50:.2f}x"),
    ]


def start_supervisor(home: Path) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, GKD_HOME=str(home), GKD_DEMO_STEP_S="60")  # a driver that stays quiet
    run_id = "bench"
    proc = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "trainer.total_steps=100000",
                             "--run-id", run_id, "--driver", "gkd_core.demo_driver", "--quiet"],
                            env=env, cwd=ROOT, start_new_session=True)
    run = home / "runs" / run_id
    deadline = time.monotonic() + 30
    while not (run / "endpoints.json").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("supervisor did not start")
        time.sleep(0.05)
    return proc, run


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def subscriber_main(run: str, out: str, duration: float) -> None:
    """In its own process: attach, apply, and time `lat` log events from emit to apply."""
    from gkd_core.subscriber import RunSubscriber

    sub = RunSubscriber(Path(run))
    sub.connect()
    Path(out + ".ready").write_text("1")
    lat: list[float] = []
    end = time.monotonic() + duration
    while time.monotonic() < end:
        for e in sub.pump(0.05):
            if isinstance(e, ev.LogEvent) and e.message.startswith("lat "):
                lat.append((time.monotonic_ns() - int(e.message[4:])) / 1e6)
    Path(out).write_text(json.dumps({"lat_ms": lat, "gaps": sub.gaps, "snapshots": sub.snapshots}))


def emit_at_rate(rep: Reporter, rate: int, seconds: float) -> int:
    """Emit ``rate`` events/s for ``seconds``, in 1 ms slices; returns how many were emitted."""
    per_slice = max(1, rate // 1000)
    n = 0
    start = time.monotonic()
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + per_slice
        while n < due:
            rep.emit(ev.LogEvent(message=f"lat {time.monotonic_ns()}"))
            n += 1
        time.sleep(0.001)
    return n


def bench_latency_and_cpu(rates: list[int], seconds: float) -> list[tuple[str, str, str]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="gkdb") as tmp:
        home = Path(tmp)
        proc, run = start_supervisor(home)
        ingest = json.loads((run / "endpoints.json").read_text())["ingest"]
        try:
            for rate in rates:
                out = str(home / f"lat{rate}.json")
                sub = subprocess.Popen([sys.executable, __file__, "--subscriber", str(run), out,
                                        str(seconds + 4)], cwd=ROOT)
                ready_by = time.monotonic() + 60
                while not Path(out + ".ready").exists():
                    if sub.poll() is not None or time.monotonic() > ready_by:
                        raise RuntimeError(f"the latency subscriber is not ready (exit {sub.poll()}, 60 s at most)")
                    time.sleep(0.05)
                rep = Reporter("bench/0", ingest=ingest, heartbeat_s=1.0, queue_max=1_000_000,
                               sndhwm=1_000_000)
                cpu0, wall0 = cpu_seconds(proc.pid), time.monotonic()
                sent = emit_at_rate(rep, rate, seconds)
                cpu = (cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - wall0) * 100
                rep.close(timeout_s=5)
                sub.wait(seconds + 30)
                res = json.loads(Path(out).read_text())
                lat = res["lat_ms"]
                if not lat:
                    raise SystemExit(f"bench_spine: none of the {sent} events sent at {rate} events/s reached the "
                                     "subscriber (the supervisor's and the subscriber's errors, if any, are above)")
                rows.append((f"emit -> subscriber apply @ {rate / 1e3:g} k/s",
                             f"p50 {pct(lat, 50):.2f} ms  p99 {pct(lat, 99):.2f} ms",
                             f"{len(lat)}/{sent} arrived, {res['gaps']} gaps, {rep.dropped} dropped at emit"))
                rows.append((f"supervisor CPU @ {rate / 1e3:g} k events/s", f"{cpu:.1f} % of one core",
                             "one subscriber attached"))
        finally:
            proc.terminate()
            proc.wait(30)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--subscriber", nargs=3, metavar=("RUN", "OUT", "SECONDS"), help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=10.0, help="length of each rate run")
    p.add_argument("--quick", action="store_true", help="smaller sizes: 30,000 events, 2 s per rate")
    p.add_argument("--smoke", action="store_true", help="the smallest: 3,000 events, 1 s at 1 k and 5 k events/s, "
                                                        "for CI")
    a = p.parse_args()
    if a.subscriber:
        subscriber_main(a.subscriber[0], a.subscriber[1], float(a.subscriber[2]))
        return
    n = 3_000 if a.smoke else 30_000 if a.quick else 300_000
    rows = bench_reducer(n) + bench_emit(n // 3)
    rates = [1_000, 5_000] if a.smoke else [1_000, 50_000]
    rows += bench_latency_and_cpu(rates, 1.0 if a.smoke else 2.0 if a.quick else a.seconds)
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    with records.kept("spine", smoke=a.smoke) as kept_run:
        print(f"{'what':{w0}}  {'measured':{w1}}  against")
        print(f"{'-' * w0}  {'-' * w1}  {'-' * 30}")
        for what, measured, against in rows:
            print(f"{what:{w0}}  {measured:{w1}}  {against}")
        print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}, pyzmq {zmq.pyzmq_version()} "
              f"(libzmq {zmq.zmq_version()})")
        # the figures to follow over runs, read back from the rows as printed ("p50 0.40 ms  p99 2.25 ms": 3rd of 4)
        measured = {what: [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*", m)] for what, m, _ in rows}
        for what, index, label, unit in (
                ("reducer: RunState.apply", 0, "the reducer's apply", " k events/s"),
                ("reducer: decode + apply", 0, "decode and apply", " k events/s"),
                ("emit -> subscriber apply @ 1 k/s", 3, "emit to a subscriber's apply at 1 k/s, p99", " ms"),
                ("supervisor CPU @ 1 k events/s", 0, "the supervisor's CPU at 1 k events/s", " % of a core")):
            if what in measured:
                kept_run.figure(label, measured[what][index], unit)

if __name__ == "__main__":
    main()
