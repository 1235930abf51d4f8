"""The dashboard under a synthetic run: N workers at 1 Hz heartbeats plus bursts of 20 k events/s,
through a real supervisor, into a headless dashboard process. Prints a table.

    python bench/bench_dashboard.py [--workers 4096 16384 65536] [--per-node 8] [--seconds 30] [--rounds 3]
    python bench/bench_dashboard.py --workers 65536 --plots   # the plots view open (p) instead of the table
    python bench/bench_dashboard.py --workers 65536 --busy 2   # two busy loops hold the cores (a busy head node)
    python bench/bench_dashboard.py --workers 131072 --gpus-per-node 8   # and every node's GPUs
    python bench/bench_dashboard.py --smoke   # for CI: 64 workers (8 GPUs a node) for 8 s, one 2 k/s burst, keyframes
                                              # every 0.2 MB

The workers report the way a run's do: each node's heartbeats reach the supervisor as one
``heartbeats`` message a second, made by the relay's own batcher (``gkd_core.telemetry.relay``), each
beat with a CPU share and RSS that move a little and its node's memory;
``--per-node 1`` sends them one by one, as before the relay. Phases and registrations go one event
each.

Measured in the dashboard process: phase-change-to-screen latency (a probe worker changes phase
every 0.3-0.7 s with its emit time in the detail; the time is taken when the table renders its row).
Every probe sent counts: one overtaken by the next before a redraw showed it is on screen when a
newer one first is, and its latency runs to then; one never on screen by the end, neither itself nor
overtaken, counts as the whole time from its sending to the end of the measurement (the least it could
have been). The table prints how many were sent, how many were drawn themselves and how many never were
on screen (``unseen``). Also CPU (percent of one core), RSS after 10 s, half-way and at the end
(flat = no growth), and the backlog: each second of the load, from its first, how old the newest
event the dashboard has applied is (one that falls behind sees that age grow), and how often it had
to re-snapshot because its SUB queue overflowed. ``--plots``: the plots view is open instead of the
table (no latency then: the table is not drawn), and the load adds what it plots: a step's metrics,
a sync, the teacher's counts and 64 GPUs' readings, each second. ``--rounds``: each size measured
that many times; the table gives the median of the rounds with min-max. Beside
it, the supervisor's CPU over the same time and its RSS at the end, and a replay of the run's log:
how long it takes to open at its end from the supervisor's keyframes and reading the whole log, and
whether it shows what the live supervisor showed (every worker's phase, step and heartbeat, and the
alerts). ``--busy N``: N processes spin beside it all the while, each holding a core as a job's own work
on the head node does (the supervisor runs beside the trainer). ``--smoke`` fails if no probe reached the
screen or the replay differs from the live state.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.runlog import keyframes  # noqa: E402
from gkd_core.state import RunState, decode_state  # noqa: E402
from gkd_core.state.gpu_cases import event_of  # noqa: E402
from gkd_core.state.views import heartbeat_at  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402
from gkd_core.telemetry import ops, wire  # noqa: E402
from gkd_core.telemetry.beats import GPU_FULL_S  # noqa: E402
from gkd_core.telemetry.control import ControlClient  # noqa: E402
from gkd_core.telemetry.relay import HeartbeatBatcher  # noqa: E402
from gkd_tui.sources.replay import ReplaySource  # noqa: E402

GPU_SAMPLE_S = 2.0  # how often a node's agent reads its GPUs (node.agent's default)


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q / 100 * len(v)))] if v else float("nan")


def rss_bytes(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def dashboard_main(run: str, out: str, seconds: float, plots: bool = False) -> None:
    """The headless dashboard, timing how long a probe's phase change takes to reach the screen."""
    from gkd_core.subscriber import RunSubscriber
    from gkd_tui.app import GkdApp
    from gkd_tui.sources.live import LiveSource
    from gkd_tui.widgets.workers_table import WorkersTable

    lat: list[float] = []
    lat_t: list[float] = []  # when each was taken, in seconds of the load (whether it met a burst)
    drawn: dict[str, int] = {}  # a probe's detail -> when its row was first drawn with it
    t_ready = {"t": 0.0}
    rss: list[int] = []
    lag: list[float] = []
    newest = {"ts": 0.0}
    arrived: dict[str, int] = {}  # a probe's detail -> when the dashboard applied it
    lat_in: list[float] = []  # of each latency, the part before the dashboard applied the event
    pump = RunSubscriber.pump

    def noted_pump(self, *args, **kwargs):
        applied = pump(self, *args, **kwargs)
        if applied:
            newest["ts"] = max(newest["ts"], applied[-1].ts)
            for e in applied:
                if e.src == "probe/0" and getattr(e, "detail", "").startswith("t="):
                    arrived[e.detail] = time.monotonic_ns()
        return applied

    RunSubscriber.pump = noted_pump
    seen = {"last": ""}
    render_line = WorkersTable.render_line

    def timed_render_line(self, y: int):
        """The table's own line renderer; when it draws the probe's row with a phase that is new
        on screen, the probe's emit time (in its detail) gives the latency."""
        strip = render_line(self, y)
        index = int(self.scroll_y) + y - 1
        if y and 0 <= index < len(self.order) and self.order[index] == "probe/0":  # (a worker's row: its src)
            detail = self._state.workers["probe/0"].detail
            if detail.startswith("t=") and detail != seen["last"]:
                seen["last"] = detail
                drawn[detail] = time.monotonic_ns()
                lat.append((time.monotonic_ns() - int(detail[2:])) / 1e6)
                lat_t.append(time.monotonic() - t_ready["t"])
                got = arrived.pop(detail, None)  # (None: it came inside a snapshot)
                lat_in.append((got - int(detail[2:])) / 1e6 if got is not None else lat[-1])
        return strip

    WorkersTable.render_line = timed_render_line

    app = GkdApp(LiveSource(Path(run)))

    def sample() -> None:
        table = app.query_one(WorkersTable)
        if table.selected != "probe/0":  # the cursor on the probe: the table keeps its row in sight
            table.move_to("probe/0")
        rss.append(rss_bytes())
        if newest["ts"]:
            lag.append((time.monotonic() - t_ready["t"], time.time() - newest["ts"]))

    async def run_it() -> None:
        async with app.run_test(size=(160, 48), headless=True) as pilot:
            app.set_interval(1.0, sample)
            Path(out + ".ready").write_text("1")
            deadline = time.monotonic() + seconds + 300
            while not Path(out + ".go").exists() and time.monotonic() < deadline:  # the registrations, first
                await pilot.pause(0.1)
            for kept in (lat, lat_t, lat_in, rss, lag, drawn):
                kept.clear()
            if plots:
                await pilot.press("p")
            snapshots0 = app.source.sub.snapshots
            cpu0, t0 = sum(os.times()[:2]), time.monotonic()
            t_ready["t"] = t0
            await pilot.pause(seconds)
            cpu = (sum(os.times()[:2]) - cpu0) / (time.monotonic() - t0) * 100
            Path(out).write_text(json.dumps({"lat_ms": lat, "lat_t": lat_t, "lat_in": lat_in, "rss": rss, "cpu": cpu,
                                             "lag_s": lag, "drawn": drawn, "end_ns": time.monotonic_ns(),
                                             "resnapshots": app.source.sub.snapshots - snapshots0}))
            app.source.stop()

    import asyncio

    asyncio.run(run_it())


CYCLE = ("generate", "teacher_wait", "train", "sync_weights")


def load(ingest: str, workers: int, per_node: int, seconds: float, burst_rate: int,
         taken_in=lambda n: None, plotted: bool = False, gpus_per_node: int = 0,
         gpu_events: str = "batched") -> tuple[int, float, list[int]]:
    """Heartbeats of ``workers`` workers at 1 Hz, ``per_node`` to a node (one batch per node a second),
    a probe phase change every 0.3-0.7 s (after 2 s), and a 1 s burst of ``burst_rate`` events every
    10 s, the way a run's steps make them: whole lanes of workers (``burst_rate`` at most, so one lane of
    4,096 and four of 16,384 at 65,536) move to their next phase together, one lane a burst, and the
    rest of the burst is progress within a phase (a new detail). A lane not moved waits in its phase or,
    before its first step, idle: no worker is late, so the diagnosis has nobody to name, as in a healthy
    run. Returns how many messages were sent, the CPU the load itself took (percent of a core: on a
    small machine it competes with what is measured), and each probe's emit time (ns). ``plotted``: a step's
    metrics, a sync, the teacher's counts and 64 GPUs' readings each second as well. ``taken_in(n)`` waits
    until the supervisor has taken in the first ``n`` messages (the registrations: what a run's start costs
    is not measured). ``gpus_per_node``: each node's GPUs read every GPU_SAMPLE_S as well, busy and steady with
    their memory held, the nodes spread over the period, their first readings sent with the registrations (as each
    node's agent starts): ``batched``, as a node's agent sends them, one ``gpus`` batch a node when its deadband
    lets them through, which for GPUs this steady is all of them every GPU_FULL_S, each node at its own turn
    (tests/unit/test_gpu_deadband.py); ``each``, as it sent them before, a ``gpu`` event a GPU every sample."""
    cpu0 = time.process_time()
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.sndhwm = 1_000_000
    sock.connect(ingest)
    rnd = random.Random(0)
    nodes = (workers + per_node - 1) // per_node
    for i in range(workers):
        n = i // per_node
        sock.send(wire.encode(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"node-{n}",
                                           pid=10_000 + i, gpus=[i % 8], ts=time.time(),
                                           via=f"agent/node-{n}" if per_node > 1 else "")))
        sock.send(wire.encode(ev.PhaseEvent(src=f"rollout/{i}", phase="idle", ts=time.time())))
    full_every = round(GPU_FULL_S / GPU_SAMPLE_S)  # (a node's samples between its batches, steady)
    for n in range(nodes if gpus_per_node else 0):  # its GPUs' first readings, sent as its agent starts
        sock.send(wire.encode(ev.GpusEvent(src=f"agent/node-{n}", node=f"node-{n}", ts=time.time(),
                                           readings=gpu_readings(n, gpus_per_node, per_node, rnd))))
    taken_in(2 * workers + (nodes if gpus_per_node else 0))
    lane_size = min(workers, burst_rate)
    lanes = (workers + lane_size - 1) // lane_size
    moves = [0] * lanes  # how many phases each lane has gone through
    batchers = [HeartbeatBatcher(f"agent/node-{n}", f"node-{n}") for n in range(nodes)]
    sent, start = 2 * workers, time.monotonic()
    # probes start once the dashboard has taken in the registrations, and come at irregular
    # intervals, so they do not keep the same phase against its redraw timer
    next_probe = start + 2.0
    probes: list[int] = []
    next_plotted, tick = start, 0
    node = gpu_node = 0
    burst_at, burst_sent, lane_sent = -1, 0, 0
    while (elapsed := time.monotonic() - start) < seconds:
        # each node's heartbeats once a second, the nodes spread over the second in 10 ms slices
        due = int(elapsed * nodes)
        while node < due:
            n = node % nodes
            b, now = batchers[n], time.time()
            # as a real node's: CPU and RSS that move a little each beat, and the node's memory, which every
            # worker's beat carries
            mem = ev.MemoryBeat("node", (100 << 30) + rnd.randrange(64 << 20), 1 << 40, 900 << 30, 0)
            for i in range(n * per_node, min(workers, (n + 1) * per_node)):
                b.add(ev.Beat(f"rollout/{i}", now, "generate", 1.0, (1 << 30) + rnd.randrange(4 << 20),
                              rnd.uniform(45.0, 55.0), 0, mem))
            if per_node > 1:
                sock.send_multipart(b.take())
                sent += 1
            else:  # one by one, the way workers sent them before the relay
                for beat in b.beats:
                    sock.send(wire.encode(ev.event_of_beat(beat)))
                    sent += 1
                b.beats = []
            node += 1
        # each node's GPUs every GPU_SAMPLE_S, the nodes spread over the period
        due = int(elapsed / GPU_SAMPLE_S * nodes) if gpus_per_node else 0
        while gpu_node < due:
            n, sample = gpu_node % nodes, gpu_node // nodes + 1
            # (each node's full batch at its own turn: the nodes' agents started at different moments)
            readings = (gpu_readings(n, gpus_per_node, per_node, rnd)
                        if gpu_events == "each" or (sample + n) % full_every == 0 else [])
            if gpu_events == "each":
                for r in readings:
                    sock.send(wire.encode(event_of(r, f"node-{n}", time.time(), f"agent/node-{n}")))
                    sent += 1
            elif readings:
                sock.send(wire.encode(ev.GpusEvent(src=f"agent/node-{n}", node=f"node-{n}", ts=time.time(),
                                                   readings=readings)))
                sent += 1
            gpu_node += 1
        if int(elapsed) % 10 == 5:  # a burst second: the lane moves, spread over it, then progress
            if burst_at != int(elapsed):
                burst_at, burst_sent, lane_sent = int(elapsed), 0, 0
                lane = (int(elapsed) // 10) % lanes
                phase = CYCLE[moves[lane] % len(CYCLE)]
                moves[lane] += 1
                members = range(lane * lane_size, min(workers, (lane + 1) * lane_size))
            share = min(burst_rate, int((elapsed - burst_at + 0.01) * burst_rate)) - burst_sent
            for _ in range(max(0, share)):
                if lane_sent < len(members):
                    i, e_phase, detail = members[lane_sent], phase, ""
                    lane_sent += 1
                else:  # progress: a worker's phase again, with a new detail
                    i = rnd.randrange(min(workers, sum(1 for m in moves if m) * lane_size))  # lanes move in order
                    e_phase, detail = CYCLE[(moves[i // lane_size] - 1) % len(CYCLE)], f"progress {burst_sent}"
                sock.send(wire.encode(ev.PhaseEvent(src=f"rollout/{i}", phase=e_phase, detail=detail,
                                                  step=(moves[i // lane_size] - 1) // len(CYCLE) + 1,
                                                  ts=time.time())))
                sent += 1
            burst_sent += max(0, share)
        if time.monotonic() >= next_probe:
            probes.append(time.monotonic_ns())
            sock.send(wire.encode(ev.PhaseEvent(src="probe/0", phase=rnd.choice(CYCLE),
                                              detail=f"t={probes[-1]}", ts=time.time())))
            sent += 1
            next_probe += rnd.uniform(0.3, 0.7)
        if plotted and time.monotonic() >= next_plotted:
            tick += 1
            for e in plotted_events(tick, rnd):
                sock.send(wire.encode(e))
                sent += 1
            next_plotted += 1.0
        time.sleep(0.01)
    load_cpu = (time.process_time() - cpu0) / (time.monotonic() - start) * 100
    sock.close(linger=2000)
    return sent, load_cpu, probes


def gpu_readings(n: int, gpus: int, per_node: int, rnd: random.Random) -> list[ev.GpuReading]:
    """Node ``n``'s GPUs, busy and steady, each held by one of its workers."""
    return [ev.GpuReading(index=g, uuid=f"GPU-{n}-{g}", util=rnd.uniform(95.0, 99.0),
                          mem_used=(60 << 30) + rnd.randrange(64 << 20), mem_total=80 << 30, temp=70.0, power=600.0,
                          pids=[10_000 + n * per_node + g % per_node]) for g in range(gpus)]


def plotted_events(step: int, rnd: random.Random) -> list:
    """A second of what the plots view draws: a step's metrics and its sync, the teacher's counts from both
    sides, and readings of 64 GPUs (8 nodes of 8)."""
    now = time.time()
    out = [ev.MetricsEvent(src="driver", step=step, loss=2.0 / step, kl=1.0 / step, agreement=min(1.0, step / 100),
                           timing={"generate": rnd.uniform(0.3, 0.5), "teacher": 0.2, "train": 0.3, "sync": 0.05},
                           ts=now),
           ev.SyncEvent(src="driver", sync_id=step, state="done", step=step, elapsed_s=rnd.uniform(0.04, 0.08),
                        timeout_s=60, ts=now),
           ev.TeacherEvent(src="driver", side="client", sent=6 * step, completed=6 * step,
                           latency_ms={"p50": rnd.uniform(20, 40), "p99": rnd.uniform(50, 90)}, ts=now),
           ev.TeacherEvent(src="teacher/proxy", side="server", received=6 * step, served=6 * step,
                           queue_depth=rnd.randrange(4), ts=now)]
    out += [ev.GpuEvent(src=f"agent/node-{g // 8}", node=f"node-{g // 8}", index=g % 8, util=rnd.uniform(40, 100),
                        mem_used=rnd.randrange(40, 80) << 30, mem_total=80 << 30, ts=now) for g in range(64)]
    return out


def every_probe(sent: list[int], drawn: dict[str, int], end: int) -> tuple[list[float], int]:
    """Each probe's latency (ms): to when its row was drawn with it, or, overtaken by a newer one before a
    redraw showed it, to when a newer one first was (the screen had gone past it then), or, never on screen
    by ``end`` (when the measurement stopped, ns), to then; and how many were never on screen."""
    shown = sorted((int(d[2:]), t) for d, t in drawn.items())
    out, missing = [], 0
    first_after: list[int | None] = [None] * len(shown)  # from each drawn probe on: the earliest drawing
    best = None
    for k in range(len(shown) - 1, -1, -1):
        best = shown[k][1] if best is None else min(best, shown[k][1])
        first_after[k] = best
    emits = [e for e, _ in shown]
    for t in sent:
        j = bisect.bisect_left(emits, t)
        if j == len(shown):  # (no probe from it on was drawn: it counts, as long as the bench went on after it)
            missing += 1
            out.append((end - t) / 1e6)
        else:
            out.append((first_after[j] - t) / 1e6)
    return out, missing


def wait_for(path: Path, what: str, proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until ``path`` exists; a clear error if ``proc`` died first or it took over ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"bench_dashboard: {what} exited ({proc.returncode}) before writing {path.name}")
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_dashboard: no {path.name} from {what} after {timeout_s:g} s")
        time.sleep(0.05)


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def same_state(live: RunState, replayed: RunState, heartbeat_s: float) -> list[str]:
    """Where a replay at the end differs from the live state: a worker's phase, step or heartbeat (to
    within a period: the log keeps a quiet worker's every few seconds, the replay fills between), or
    the alerts."""
    out = []
    for src, w in live.workers.items():
        r = replayed.workers.get(src)
        if r is None:
            out.append(f"{src} missing")
        elif (r.phase, r.step, r.phase_since) != (w.phase, w.step, w.phase_since):
            out.append(f"{src}: {r.phase}/{r.step} against {w.phase}/{w.step}")
        elif abs((beat := heartbeat_at(replayed, r)) - heartbeat_at(live, w)) > 1.5 * heartbeat_s:
            out.append(f"{src}: heartbeat {beat - heartbeat_at(live, w):+.1f} s")
    if sorted(live.alerts) != sorted(replayed.alerts):
        out.append(f"alerts {sorted(replayed.alerts)} against {sorted(live.alerts)}")
    return out


def busy_loops(n: int, seconds: float) -> list[subprocess.Popen]:
    """``n`` processes that each spin for ``seconds`` at most (and are stopped sooner by the caller)."""
    spin = f"import time\nend = time.monotonic() + {seconds:.0f}\nwhile time.monotonic() < end:\n    pass\n"
    return [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(n)]


def measure(workers: int, per_node: int, seconds: float, burst_rate: int, keyframe_mb: float | None,
            plots: bool = False, busy: int = 0, gpus: tuple[int, str] = (0, "batched")) -> dict:
    spinning = busy_loops(busy, seconds + 600)  # (registrations and the replay included: stopped at the end)
    try:
        return _measure(workers, per_node, seconds, burst_rate, keyframe_mb, plots, gpus) | {"busy": busy}
    finally:
        for p in spinning:
            p.kill()
            p.wait()


def _measure(workers: int, per_node: int, seconds: float, burst_rate: int, keyframe_mb: float | None,
             plots: bool, gpus: tuple[int, str]) -> dict:
    with tempfile.TemporaryDirectory(prefix="gkdd") as tmp:
        home = Path(tmp)
        env = dict(os.environ, GKD_HOME=str(home), GKD_DEMO_STEP_S="60")
        every = [] if keyframe_mb is None else [f"telemetry.keyframe_mb={keyframe_mb:g}"]
        sup = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "trainer.total_steps=100000", *every,
                                "--run-id", "bench", "--driver", "gkd_core.demo_driver", "--quiet"],
                               env=env, cwd=ROOT, start_new_session=True)
        run = home / "runs" / "bench"
        wait_for(run / "endpoints.json", "the supervisor's endpoints", sup)
        ingest = json.loads((run / "endpoints.json").read_text())["ingest"]
        out = str(home / "dash.json")
        dash = subprocess.Popen([sys.executable, __file__, "--dashboard", str(run), out, str(seconds),
                                 *(["--plots"] if plots else [])], cwd=ROOT, env=env)
        wait_for(Path(out + ".ready"), "the headless dashboard", dash)
        endpoints = json.loads((run / "endpoints.json").read_text())

        with ControlClient.for_run(run, endpoints, timeout_s=30.0) as c:
            seq0 = c.request("ping")["seq"]

        def taken_in(n: int) -> None:
            """Until the supervisor has the registrations and the dashboard has had 2 s for them: then the
            dashboard's measurement begins."""
            with ControlClient.for_run(run, endpoints, timeout_s=30.0) as c:
                deadline = time.monotonic() + 120
                while c.request("ping")["seq"] < seq0 + n:
                    if time.monotonic() > deadline:
                        print(f"  {workers}: the supervisor had not taken in the registrations after 120 s; "
                              "measuring anyway", file=sys.stderr)
                        break
                    time.sleep(0.2)
            time.sleep(2.0)
            Path(out + ".go").write_text("1")
            sup_cpu0[:] = cpu_seconds(sup.pid), time.monotonic()
            go_wall[:] = [time.time()]

        go_wall: list[float] = []
        sup_cpu0: list[float] = []
        sent, load_cpu, probes = load(ingest, workers, per_node, seconds - 1, burst_rate, taken_in, plotted=plots,
                                      gpus_per_node=gpus[0], gpu_events=gpus[1])
        load_ended = time.time()
        sup_cpu = (cpu_seconds(sup.pid) - sup_cpu0[0]) / (time.monotonic() - sup_cpu0[1]) * 100
        dash.wait(seconds + 60)
        time.sleep(1.0)  # the supervisor takes in the last of it
        with ControlClient.for_run(run, json.loads((run / "endpoints.json").read_text()), timeout_s=30.0) as c:
            snap = c.call(ops.SnapshotArgs())
        live = decode_state(snap.state)
        # the diagnosis's passes while the load ran (each its own time: its turns', the ingest read between them apart)
        passes = [ms for ended, ms in snap.supervisor.get("alert_passes", []) if go_wall[0] <= ended <= load_ended]
        sup_rss = rss_bytes(sup.pid) / 2**20
        sup.terminate()
        sup.wait(60)
        res = json.loads(Path(out).read_text())
        log = run / "events.jsonl"
        log_mb = log.stat().st_size / 2**20
        t1 = time.monotonic()
        ReplaySource(log).to_end()  # opening the recording at its end, as `gkd-tui replay` + End
        replay_s = time.monotonic() - t1
        t1 = time.monotonic()
        ReplaySource(log, keyframes=False).to_end()  # the same, reading the whole log
        whole_s = time.monotonic() - t1
        frames = len(keyframes.frames(run / "keyframes"))
        # the same state as live: the recording seeked to the snapshot's newest event (after it, the run was
        # stopped; the log's last heartbeats, restated when it closed, are filled up to that moment)
        replay = ReplaySource(log)
        replay.seek(live.last_ts)
        differ = same_state(live, replay.state, 1.0)
        worst = sorted(zip(res["lat_ms"], res["lat_in"], res["lat_t"], strict=True), reverse=True)[:5]
        print(f"  {workers}: {len(live.alerts)} alert(s) at the end; the slowest probes (ms, of which before the "
              "dashboard had it, @ s): " + ", ".join(f"{ms:.0f} ({i:.0f}) @ {t:.1f}" for ms, i, t in worst)
              + "; the keyframes kept were written @ s: " + ", ".join(
                  f"{keyframes.read_header(f).written - go_wall[0]:.1f}" for f in keyframes.frames(run / "keyframes")),
              file=sys.stderr)
        if differ:
            print(f"  replay at {workers}: {len(differ)} difference(s), e.g. "
                  + "; ".join(d[:200] for d in differ[:3]), file=sys.stderr)
    lat, missing = every_probe(probes, res["drawn"], res["end_ns"])
    rss = res["rss"]
    lag = [age for t, age in res["lag_s"] if t <= seconds - 1]  # while the load ran (after it, nothing is new)
    return {"workers": workers, "plots": plots, "sent": sent, "p50": pct(lat, 50), "p99": pct(lat, 99),
            "max": max(lat or [0]), "probes": len(probes), "drawn": len(res["drawn"]), "missing": missing,
            "cpu": res["cpu"], "sup_cpu": sup_cpu, "load_cpu": load_cpu, "rss0": rss[min(10, len(rss) - 1)] / 2**20,
            "rss_mid": rss[len(rss) // 2] / 2**20, "rss1": rss[-1] / 2**20, "lag_max": max(lag or [0]),
            "lag_end": max(lag[-10:] or [0]), "resnapshots": res["resnapshots"], "replay_s": replay_s,
            "whole_s": whole_s, "frames": frames, "sup_rss": sup_rss,
            "same": not differ, "log_mb": log_mb, "passes": len(passes), "pass_p50": pct(passes, 50),
            "pass_p99": pct(passes, 99), "pass_max": max(passes or [0])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dashboard", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--per-node", type=int, default=8, help="workers per node: one heartbeats batch each a second "
                                                          "(1: every heartbeat its own message)")
    p.add_argument("--seconds", type=float, default=30)
    p.add_argument("--burst", type=int, default=20_000, help="events/s during a burst")
    p.add_argument("--keyframe-mb", type=float, help="the supervisor's telemetry.keyframe_mb (default: the config's; "
                                                     "0: no keyframes)")
    p.add_argument("--plots", action="store_true", help="the plots view open (p) instead of the table: no latency")
    p.add_argument("--busy", type=int, default=0, help="this many busy loops beside it, each holding a core (a head "
                                                       "node busy with the job's own work)")
    p.add_argument("--rounds", type=int, default=1, help="measure each size this many times: every row, then the "
                                                         "median (min-max) of the rounds")
    p.add_argument("--gpus-per-node", type=int, default=0, help="each node's GPUs read every 2 s as well (recorded "
                                                                  "apart: dashboard_gpus)")
    p.add_argument("--gpu-events", choices=("batched", "each"), default="batched",
                   help="a node's GPU readings as its agent sends them (one gpus batch, past a deadband), or a gpu "
                        "event a GPU every sample, as before")
    p.add_argument("--smoke", action="store_true", help="64 workers for 8 s (a burst of 2 k events/s at 5 s), "
                                                        "8 GPUs a node, keyframes every 0.2 MB, one round: for CI")
    a = p.parse_args()
    if a.dashboard:
        dashboard_main(a.dashboard[0], a.dashboard[1], float(a.dashboard[2]), plots=a.plots)
        return
    if a.smoke:  # 8 s: probes from 2 s in, the burst second at 5 s, the load stopping at 7 s
        a.workers, a.seconds, a.burst, a.keyframe_mb, a.rounds = [64], 8.0, 2_000, 0.2, 1
        a.gpus_per_node = a.gpus_per_node or 8  # (the GPUs' path too: their batches, their rule)
    rows = [measure(n, a.per_node, a.seconds, a.burst, a.keyframe_mb, a.plots, a.busy, (a.gpus_per_node, a.gpu_events))
            for n in a.workers for _ in range(a.rounds)]
    name = "dashboard_plots" if a.plots else "dashboard_gpus" if a.gpus_per_node else "dashboard"
    with records.kept(name, smoke=a.smoke) as kept_run:
        print(f"{'workers':>8} {'msgs sent':>10} {'probes':>7} {'drawn':>6} {'unseen':>6} {'latency p50':>12} "
              f"{'p99':>7} {'max':>7} {'CPU':>5} {'sup CPU':>8} {'load':>5} {'RSS 10s':>8} {'mid':>6} {'end':>6} "
              f"{'lag max':>8} {'last 10s':>9} {'resnaps':>8} {'log':>7} {'sup RSS':>8} {'frames':>6} {'replay':>7} "
              f"{'whole':>6} {'same':>5} {'passes':>6} {'pass p50':>9} {'p99':>7} {'max':>7}")
        for r in rows:
            latency = (f"{r['p50']:10.0f}ms {r['p99']:5.0f}ms {r['max']:5.0f}ms " if not r["plots"]
                       else f"{'-':>12} {'-':>7} {'-':>7} ")
            unseen = f"{r['missing']:6d}" if not r["plots"] else f"{'-':>6}"  # (plots: no table, nothing drawn)
            print(f"{r['workers']:8d} {r['sent']:10d} {r['probes']:7d} {r['drawn']:6d} {unseen} "
                  + latency
                  + f"{r['cpu']:4.0f}% {r['sup_cpu']:7.0f}% {r['load_cpu']:4.0f}% {r['rss0']:6.0f}MB "
                  f"{r['rss_mid']:4.0f}MB {r['rss1']:4.0f}MB {r['lag_max']:7.2f}s {r['lag_end']:8.2f}s "
                  f"{r['resnapshots']:8d} {r['log_mb']:5.0f}MB {r['sup_rss']:6.0f}MB {r['frames']:6d} "
                  f"{r['replay_s']:6.1f}s {r['whole_s']:5.1f}s {'yes' if r['same'] else 'NO':>5} {r['passes']:6d} "
                  f"{r['pass_p50']:7.1f}ms {r['pass_p99']:5.1f}ms {r['pass_max']:5.1f}ms")
        if a.rounds > 1:
            print(f"\nmedian (min-max) of {a.rounds} rounds:")
            for n in a.workers:
                mine = [r for r in rows if r["workers"] == n]
                cells = [f"{k} {spread([r[key] for r in mine], fmt)}" for k, key, fmt in (
                    ("p50", "p50", "{:.0f} ms"), ("p99", "p99", "{:.0f} ms"), ("max", "max", "{:.0f} ms"),
                    ("CPU", "cpu", "{:.0f} %"), ("sup CPU", "sup_cpu", "{:.0f} %"), ("RSS end", "rss1", "{:.0f} MB"),
                    ("lag max", "lag_max", "{:.2f} s"), ("sup RSS", "sup_rss", "{:.0f} MB"),
                    ("alerts' pass p50", "pass_p50", "{:.1f} ms"), ("p99", "pass_p99", "{:.1f} ms"),
                    ("max", "pass_max", "{:.1f} ms"))
                    if not (a.plots and key in ("p50", "p99", "max"))]
                print(f"{n:8d}: " + ", ".join(cells))
        missing = sum(r["missing"] for r in rows)
        print(f"\n{a.seconds:g} s per size, {a.per_node} workers per node, a {a.burst} events/s burst 1 s in every 10; "
              + (f"{a.gpus_per_node} GPUs a node read every {GPU_SAMPLE_S:g} s, sent "
                 + ("as a gpus batch a node past its deadband; " if a.gpu_events == "batched" else
                    "as a gpu event each; ") if a.gpus_per_node else "")
              + f"{os.cpu_count()} cores"
              + (f", {a.busy} busy loop(s) holding them beside it (a head node busy with the job); " if a.busy
                 else "; ")
              + ("the plots view open (p), with a step's metrics, a sync, the teacher and 64 GPUs each second; "
                 if a.plots else "every probe sent counts in the latency (one overtaken before it was drawn: until a "
                                 f"newer one was; one never on screen by the end, {missing} in all (unseen): from its "
                                 "sending to the end); ")
              + "the diagnosis's passes while the load ran (passes), each its own time (its turns', the ingest read "
              "between them apart): p50, p99, max; "
              + "targets: p99 <= 250 ms, CPU <= 50 % of a core, RSS flat, lag not growing, no resnapshots; replay: "
              "opening at the end from the keyframes (frames: how many the supervisor kept), beside reading the whole "
              "log, and the same state as live")
        for n in a.workers:
            mine = [r for r in rows if r["workers"] == n]
            for label, key, unit in (("p99", "p99", " ms"), ("the dashboard's CPU", "cpu", " % of a core"),
                                     ("the supervisor's CPU", "sup_cpu", " % of a core"),
                                     ("the dashboard's RSS at the end", "rss1", " MB"),
                                     ("the backlog's worst second", "lag_max", " s"),
                                     ("the alerts' pass p99", "pass_p99", " ms")):
                if not (a.plots and key == "p99"):
                    kept_run.figure(f"{n:,} workers, {label} (median of the rounds)",
                                    statistics.median(r[key] for r in mine), unit)
    if a.smoke:
        wrong = [f"{r['workers']} workers: {why}" for r in rows for why, bad in (
            ("none of the probes reached the screen", not r["drawn"] and not r["plots"]),
            ("the replay differs from the live state (the differences are above)", not r["same"]),
            ("the supervisor's snapshot said no pass of its diagnosis while the load ran", not r["passes"])) if bad]
        if wrong:
            sys.exit("bench_dashboard: " + "; ".join(wrong))


def spread(values: list[float], fmt: str) -> str:
    v = sorted(values)
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}-{fmt.format(v[-1])})"


if __name__ == "__main__":
    main()
