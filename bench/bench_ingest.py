"""The supervisor's ceiling: how many of a large run's messages a second it takes in at one core, beside a
bare loop on the same machine in the same run (ZeroMQ PULL, msgspec decode, append to a file: the limit for
one Python process), as a ratio.

    python bench/bench_ingest.py [--workers 65536] [--per-node 8] [--seconds 4] [--rounds 3]
    python bench/bench_ingest.py --against ../old-checkout   # the same bytes into another checkout's supervisor
    python bench/bench_ingest.py --still   # beats that never change, no memory (the dashboard bench's before)
    python bench/bench_ingest.py --merged  # and with a process before the supervisor that merges the batches
    python bench/bench_ingest.py --smoke   # for CI: 4,096 workers, 2 s of their messages, one round, --merged
    python bench/bench_ingest.py --smoke --against ../old-checkout   # and the comparison's code path too

The load is ``--seconds`` of what ``workers`` send, made and encoded before the clock starts, in the
dashboard bench's shape (``bench_dashboard.load``): each node's heartbeats as one batch a second from its
relay's batcher, every beat with a CPU share and RSS that move a little and the node's memory, and phase
changes between them (about 2,000 a second). It is made twice, the same beats each time: as the relays send
them (``HeartbeatBatcher``: a beat in full only when it says something its worker's last one did not, the
relay's clock for the rest) and with every beat in full, as relays sent them before that clock. Every
supervisor and the bare loop take in both: the table shows each stream's rows apart, with its bytes, and a
last line says what the relays' thinning saves (this supervisor on the thinned stream over it on the full
one), which is the relays' work, not the supervisor's. The workers register first (not timed). Then the supervisor
is stopped (SIGSTOP), the whole backlog and a marker after it are queued, and from SIGCONT the clock runs
until it has published the marker: messages a second at full speed (its CPU over that time, its ZeroMQ
I/O thread's included, says whether it had a core to itself). The bare loop takes the same bytes, queued
the same way, and times itself from its first message to its last: a PULL socket, ``msgspec`` decoding
each message as the typed event, its bytes appended to a file. ``--still``: beats that never change and carry no
memory, as the dashboard bench's were before. ``--against``: another checkout (a ``git
worktree`` of an older commit), round by round in turn with this one, fed the same bytes as this checkout's
supervisor: the stream with every beat in full, the one an older supervisor reads whole (it reads no relay's
clock, so the thinned stream would tell it that most workers had gone quiet); the comparison's figure is
this checkout's rate over its on those same bytes. ``--merged``: a round more each time,
with a process before the supervisor that takes the batches that come in a row as one event, as the
supervisor does once it has read them (``Recorder._take_batches``), and passes the rest on in order: the
supervisor reads one message where it read dozens (on the relays' thinned stream). It answers whether a second
process that decodes and gathers on the way in would raise the ceiling (#37); that process's CPU is printed after
the row's ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import msgspec  # noqa: E402
import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.supervisor.recorder import BEATS_PER_MESSAGE, merged  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402
from gkd_core.telemetry import wire  # noqa: E402
from gkd_core.telemetry.control import ControlClient  # noqa: E402
from gkd_core.telemetry.relay import HeartbeatBatcher  # noqa: E402

PHASES_A_SECOND = 2_000
MARK = "ceiling/end"
MERGER_IDLE_S = 600  # --merged's process, with nothing to take in for this long, is left behind by its bench: it ends


def backlog(workers: int, per_node: int, seconds: int, still: bool = False,
            every_beat: bool = False) -> tuple[list, list, int]:
    """(registrations, the timed messages, how many beats they carry), encoded. ``still``: every beat the same
    numbers and no memory, as the dashboard bench's were before they moved as a real node's. ``every_beat``:
    every beat in full, as a relay sent them before its clock (``RelayClock``), for an older checkout."""
    rnd = random.Random(0)
    nodes = (workers + per_node - 1) // per_node
    register = []
    for i in range(workers):
        n = i // per_node
        register.append([wire.encode(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"node-{n}",
                                                    pid=10_000 + i, via=f"agent/node-{n}", ts=time.time()))])
        register.append([wire.encode(ev.PhaseEvent(src=f"rollout/{i}", phase="generate", ts=time.time()))])
    batchers = [HeartbeatBatcher(f"agent/node-{n}", f"node-{n}") for n in range(nodes)]
    timed, beats, t0 = [], 0, time.time()
    for s in range(seconds):
        phases_every = max(1, nodes // PHASES_A_SECOND)
        for n in range(nodes):
            now = t0 + s + n / nodes
            mem = ev.MemoryBeat("node", (100 << 30) + rnd.randrange(64 << 20), 1 << 40, 900 << 30, 0)
            for i in range(n * per_node, min(workers, (n + 1) * per_node)):
                batchers[n].add(ev.Beat(f"rollout/{i}", now, "generate", 1.0, 1 << 30, 50.0, 0) if still else
                                ev.Beat(f"rollout/{i}", now, "generate", float(s), (1 << 30) + rnd.randrange(4 << 20),
                                        rnd.uniform(45.0, 55.0), 0, mem))
            if every_beat:
                frames = wire.frames(ev.HeartbeatsEvent(src=f"agent/node-{n}", node=f"node-{n}", ts=time.time(),
                                                        beats=batchers[n].beats))
                batchers[n].beats = []
            else:
                frames = batchers[n].take(now=now)
            assert frames is not None
            timed.append(frames)
            beats += min(workers, (n + 1) * per_node) - n * per_node
            if n % phases_every == 0:
                timed.append([wire.encode(ev.PhaseEvent(src=f"rollout/{rnd.randrange(workers)}", phase="generate",
                                                        detail=f"progress {s}.{n}", ts=now))])
    return register, timed, beats


def push_all(address: str, messages: list[list[bytes]]) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.sndhwm = 0  # (no limit: the whole backlog is queued at once)
    sock.connect(address)
    for m in messages:
        sock.send_multipart(m)
    return sock


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def merger_main(pull_address: str, push_address: str, ready: str) -> None:
    """``--merged``'s process before the supervisor: the ``heartbeats`` batches that come in a row, up to
    ``BEATS_PER_MESSAGE`` beats and clocks, go on as one event (``recorder.merged``, the supervisor's); every
    other message goes on as it came, in order. It runs until it is stopped, or MERGER_IDLE_S with nothing."""
    ctx = zmq.Context.instance()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.rcvhwm, push.sndhwm = 0, 0
    pull.bind(pull_address)
    push.connect(push_address)
    Path(ready).write_text("1")
    gathered: list[ev.HeartbeatsEvent] = []

    def send_gathered() -> None:
        push.send_multipart([b"heartbeats", wire.encode(merged(gathered))])
        gathered.clear()

    while True:
        if not pull.poll(MERGER_IDLE_S * 1000):  # (a wait for the first, then what is there)
            sys.exit(f"bench_ingest: the merging process heard nothing for {MERGER_IDLE_S} s: its bench is gone")
        message = pull.recv_multipart()
        items = 0
        while True:
            batch = wire.decode_batch(message[1]) if len(message) == 2 and message[0] == b"heartbeats" else None
            if batch is None:
                if gathered:
                    send_gathered()
                push.send_multipart(message)
            else:
                size = len(batch.beats) + len(batch.clocks)
                if gathered and items + size > BEATS_PER_MESSAGE:
                    send_gathered()
                    items = 0
                gathered.append(batch)
                items += size
            try:
                message = pull.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
        if gathered:
            send_gathered()


def supervisor_round(tree: Path, register: list, timed: list, merging: bool = False) -> tuple[float, float, float]:
    """(seconds the supervisor took for ``timed``, its CPU over them as a share of a core, and the merging
    process's before it, ``merging``)."""
    merger: subprocess.Popen | None = None
    with tempfile.TemporaryDirectory(prefix="gkdi") as tmp:
        env = dict(os.environ, GKD_HOME=tmp, GKD_DEMO_STEP_S="60", PYTHONPATH=str(tree))
        sup = subprocess.Popen([sys.executable, "-m", "gkd_core", "run", "trainer.total_steps=100000",
                                "--run-id", "ceiling", "--driver", "gkd_core.demo_driver", "--quiet"],
                               env=env, cwd=tree, start_new_session=True)
        try:
            run = Path(tmp) / "runs" / "ceiling"
            deadline = time.monotonic() + 120
            while not (run / "endpoints.json").exists():
                if sup.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"bench_ingest: the supervisor of {tree} did not start")
                time.sleep(0.05)
            endpoints = json.loads((run / "endpoints.json").read_text())
            ingest = endpoints["ingest"]
            if merging:
                ingest, ready = f"ipc://{tmp}/merger.sock", Path(tmp) / "merger.ready"
                merger = subprocess.Popen([sys.executable, __file__, "--merger", ingest, endpoints["ingest"],
                                           str(ready)], env=env, cwd=tree)
                while not ready.exists():
                    if merger.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("bench_ingest: the merging process did not start")
                    time.sleep(0.02)
            sub = zmq.Context.instance().socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"log")
            sub.rcvhwm = 0
            sub.connect(endpoints["events"])
            with ControlClient.for_run(run, endpoints, timeout_s=60.0) as c:
                seq0 = c.request("ping")["seq"]
                push = push_all(ingest, register)
                while c.request("ping")["seq"] < seq0 + len(register):  # the registrations: not timed
                    if time.monotonic() > deadline + 120:
                        raise SystemExit("bench_ingest: the registrations were not taken in within 240 s")
                    time.sleep(0.1)
            time.sleep(1.0)
            os.kill(sup.pid, signal.SIGSTOP)  # the backlog queued whole while it is stopped: then it takes it all
            if merger is not None:
                os.kill(merger.pid, signal.SIGSTOP)
            for m in timed:
                push.send_multipart(m)
            push.send(wire.encode(ev.LogEvent(src=MARK, message="the end", ts=time.time())))
            time.sleep(0.5)
            cpu0, t0 = cpu_seconds(sup.pid), time.monotonic()
            merger_cpu0 = cpu_seconds(merger.pid) if merger is not None else 0.0
            if merger is not None:
                os.kill(merger.pid, signal.SIGCONT)
            os.kill(sup.pid, signal.SIGCONT)
            while True:  # until the marker is published: everything before it was taken in
                if not sub.poll(300_000):
                    raise SystemExit("bench_ingest: no marker from the supervisor within 300 s")
                if MARK.encode() in sub.recv_multipart()[-1]:
                    break
            took = time.monotonic() - t0
            cpu = (cpu_seconds(sup.pid) - cpu0) / took
            merger_cpu = (cpu_seconds(merger.pid) - merger_cpu0) / took if merger is not None else 0.0
            push.close(0)
            sub.close(0)
            return took, cpu, merger_cpu
        finally:
            sup.terminate()
            sup.wait(60)
            if merger is not None:
                merger.kill()
                merger.wait(60)


def bare_loop_main(address: str, count: int, out: str) -> None:
    """The limit for one process: PULL, decode each message as its typed event, append its bytes to a file."""
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.rcvhwm = 0
    sock.bind(address)
    decoder = msgspec.json.Decoder(ev.AnyEvent)
    Path(out + ".ready").write_text("1")
    with open(out, "ab") as log:
        data = sock.recv_multipart()[-1]
        cpu0, t0 = sum(os.times()[:2]), time.monotonic()
        for _ in range(count):
            decoder.decode(data)
            log.write(data + b"\n")
            data = sock.recv_multipart()[-1] if _ < count - 1 else b""
    # its seconds from its first message to its last, and its CPU seconds over them
    Path(out + ".done").write_text(json.dumps([time.monotonic() - t0, sum(os.times()[:2]) - cpu0]))


def bare_round(timed: list) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="gkdb") as tmp:
        address, out = f"ipc://{tmp}/bare.sock", f"{tmp}/bare.log"
        proc = subprocess.Popen([sys.executable, __file__, "--bare", address, str(len(timed)), out])
        while not Path(out + ".ready").exists():
            if proc.poll() is not None:
                raise SystemExit("bench_ingest: the bare loop exited before it was ready")
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGSTOP)  # as the supervisor's: the backlog queued whole first
        push = push_all(address, timed)
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGCONT)
        proc.wait(300)
        push.close(0)
        took, cpu = json.loads(Path(out + ".done").read_text())
        return took, cpu / took


THIS, MERGED = "this checkout", "merged before it"
BEATS_HEAD = "workers' beats/s"  # (what they made: a beat said by a clock counts as one)
THINNED, FULL = "the relays' thinned batches", "every beat in full (what an older supervisor reads)"


def in_full(timed: list[list[bytes]]) -> int:
    """How many beats the ``heartbeats`` batches of ``timed`` carry in full."""
    return sum(len(batch.beats) for m in timed if len(m) == 2 and (batch := wire.decode_batch(m[1])) is not None)


def per_round(over: list[float], under: list[float]) -> list[float]:
    """Each round's ratio of two rows' rates (the rounds ran in turn, so a round's are beside each other)."""
    return [o / u for o, u in zip(over, under, strict=True)]


def spread(values: list[float], fmt: str) -> str:
    v = sorted(values)
    return f"{fmt.format(statistics.median(v))} ({fmt.format(v[0])}-{fmt.format(v[-1])})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bare", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--merger", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=65536)
    p.add_argument("--per-node", type=int, default=8)
    p.add_argument("--seconds", type=int, default=4, help="seconds of the workers' messages in the backlog")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--still", action="store_true", help="beats that never change and carry no memory (the "
                                                        "dashboard bench's before they moved as a real node's)")
    p.add_argument("--against", type=Path, help="another checkout's supervisor, in turn, fed the same bytes as "
                                                "this one's: every beat in full")
    p.add_argument("--merged", action="store_true", help="also this checkout with a process before its supervisor "
                                                         "that merges the batches that come in a row")
    p.add_argument("--smoke", action="store_true", help="4,096 workers, 2 s of messages, one round: for CI")
    a = p.parse_args()
    if a.bare:
        bare_loop_main(a.bare[0], int(a.bare[1]), a.bare[2])
        return
    if a.merger:
        merger_main(*a.merger)
        return
    if a.smoke:  # (with the merging process and the full beats' stream: their code paths are the bench's too)
        a.workers, a.seconds, a.rounds, a.merged = 4096, 2, 1, True
    register, thinned, beats = backlog(a.workers, a.per_node, a.seconds, a.still)
    full = backlog(a.workers, a.per_node, a.seconds, a.still, every_beat=True)[1]
    assert len(full) == len(thinned)  # (the same messages, a batch for a batch: only what each batch says differs)
    # (the stream, the row's name, its checkout, whether merged before it); the same bytes into every row of a stream
    against = f"--against {a.against}"
    rows_of = [(FULL, THIS, ROOT, False)] + ([(FULL, against, a.against.resolve(), False)] if a.against else []) + [
        (THINNED, THIS, ROOT, False)] + ([(THINNED, MERGED, ROOT, True)] if a.merged else [])
    streams = {FULL: full, THINNED: thinned}
    rows: dict[tuple[str, str], list[tuple[float, float, float]]] = {(st, name): [] for st, name, _, _ in rows_of}
    bare: dict[str, list[tuple[float, float]]] = {FULL: [], THINNED: []}
    for _ in range(a.rounds):
        for st, timed in streams.items():
            bare[st].append(bare_round(timed))
        for st, name, tree, merging in rows_of:
            rows[st, name].append(supervisor_round(tree, register, streams[st], merging))
    messages = len(thinned)
    with records.kept("ingest", smoke=a.smoke) as kept_run:
        batches = -(-a.workers // a.per_node) * a.seconds
        print(f"{a.workers:,} workers, {a.per_node} to a node: {a.seconds} s of their messages ({messages:,}: "
              f"{beats:,} beats in {batches:,} batches and {messages - batches:,} phase changes), queued whole "
              f"and then taken in; {a.rounds} round(s), the median (min-max)"
              + ("; beats that never change and carry no memory (--still)" if a.still else ""))
        print(f"{'':30} {'messages/s':>22} {BEATS_HEAD:>24} {'CPU (of a core)':>18} {'of its bare loop':>17}")
        bare_rate = {st: [messages / t for t, _ in bare[st]] for st in streams}
        rate = {key: [messages / t for t, _, _ in each] for key, each in rows.items()}
        for st, timed in streams.items():
            print(f"{st}: {sum(len(f) for m in timed for f in m) / 2**20:,.1f} MB, {in_full(timed):,} beats in full"
                  + (" (every one)" if st == FULL else " (the rest said by the relays' clocks, one a batch)"))
            print(f"{'  bare loop':30} {spread(bare_rate[st], '{:,.0f}'):>22} "
                  f"{spread([beats / t for t, _ in bare[st]], '{:,.0f}'):>24} "
                  f"{spread([100 * c for _, c in bare[st]], '{:.0f} %'):>18} {'1':>17}")
            for _, name, _, merging in (r for r in rows_of if r[0] == st):
                ratio = [r / b for r, b in zip(rate[st, name], bare_rate[st], strict=True)]
                print(f"{'  supervisor, ' + name:30} {spread(rate[st, name], '{:,.0f}'):>22} "
                      f"{spread([beats / t for t, _, _ in rows[st, name]], '{:,.0f}'):>24} "
                      f"{spread([100 * c for _, c, _ in rows[st, name]], '{:.0f} %'):>18} {spread(ratio, '{:.2f}'):>17}"
                      + (f"   and the merging process {spread([100 * m for _, _, m in rows[st, name]], '{:.0f} %')}"
                         if merging else ""))
        thinning = per_round(rate[THINNED, THIS], rate[FULL, THIS])
        print(f"\nwhat the relays' thinning saves (their work, not the supervisor's): this checkout's supervisor on "
              f"the thinned stream over it on every beat in full, {spread(thinning, '{:.2f}x')}")
        if a.against:
            speedup = per_round(rate[FULL, THIS], rate[FULL, against])
            print(f"the supervisor's own speed-up, the same bytes into both (every beat in full): this checkout over "
                  f"{against}, {spread(speedup, '{:.2f}x')}")
        print(f"{os.cpu_count()} cores; a second of the run is {messages // a.seconds:,} messages: the supervisor "
              "keeps up with a run whose rate is below its own")
        what = f"{a.workers:,} workers" + (", still beats" if a.still else "")
        ours = rate[THINNED, THIS]
        kept_run.figure(f"{what}, the supervisor's messages a second at one core, fed the relays' thinned batches "
                        "(median)", statistics.median(ours), " msg/s")
        kept_run.figure(f"{what}, the supervisor's rate over the bare loop's, both fed the relays' thinned batches "
                        "(median)", statistics.median(per_round(ours, bare_rate[THINNED])))
        kept_run.figure(f"{what}, the supervisor's messages a second at one core, fed every beat in full (median)",
                        statistics.median(rate[FULL, THIS]), " msg/s")
        kept_run.figure(f"{what}, what the relays' thinning saves: the supervisor's rate on their thinned batches over"
                        " its rate on every beat in full (median)", statistics.median(thinning), "x")
        if a.against:
            kept_run.figure(f"{what}, the supervisor's own speed-up: this checkout's rate over {against}'s, the same "
                            "bytes into both, every beat in full (median)", statistics.median(speedup), "x")
        if a.merged:
            kept_run.figure(f"{what}, the supervisor's rate with its batches merged before it, over its rate without,"
                            " both fed the relays' thinned batches (median)",
                            statistics.median(per_round(rate[THINNED, MERGED], ours)), "x")
    if a.smoke and not all(t > 0 for each in rows.values() for t, _, _ in each):
        sys.exit("bench_ingest: no round measured")


if __name__ == "__main__":
    main()
