"""What tracking collectives costs: a gloo broadcast bare, with our wrapper, and with the Flight Recorder on.

    python bench/bench_collectives.py [--ranks 4] [--rounds 7] [--per-round 200]
    python bench/bench_collectives.py --smoke   # for CI: 2 ranks, one round of 5, the smaller tensor

Real processes in one gloo group broadcast a flat float tensor (512 KiB and 8 MiB), as the trainer's
weight sync does. Each rank runs a Reporter that sends to a real
PULL socket, as in a run. Three ways, side by side in one run:

- ``bare``: ``dist.broadcast`` and nothing else;
- ``gkd``: the trainer's wrapper (``TRACKER.enter`` / ``leave``), whose change wakes the Reporter,
  which sends a ``collectives`` event;
- ``flight recorder``: ``TORCH_FR_BUFFER_SIZE=2000`` (what a watched job gets), read by the Reporter
  at each heartbeat. The recorder is a process-wide setting, so these ranks are other processes.

``bare`` and ``gkd`` alternate round by round in the same processes. Also timed: one ``snapshot()``
(what each heartbeat pays), with the recorder's buffer full. Medians of the rounds, with min and max.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

SIZES = {"131 k floats (512 KiB)": 131_072, "2.1 M floats (8 MiB)": 2_097_152}


def rank_main(rank: int, world: int, rendezvous: str, modes: list[str], rounds: int, per_round: int, out,
              sizes: dict[str, int]) -> None:
    import torch
    import torch.distributed as dist
    import zmq

    from gkd_core.telemetry import collectives
    from gkd_core.telemetry.reporter import Reporter

    torch.set_num_threads(1)
    sink = zmq.Context.instance().socket(zmq.PULL)
    sink.bind("tcp://127.0.0.1:*")
    rep = Reporter(f"rank/{rank}", ingest=sink.last_endpoint.decode(), run="bench", heartbeat_s=1.0)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=world)
    collectives.TRACKER.joined("bench", rank, world)
    results: dict[tuple[str, str], list[float]] = {}
    for label, n in sizes.items():
        t = torch.zeros(n)
        for _ in range(20):  # warm up the pairs
            dist.broadcast(t, src=0)
        for _ in range(rounds):
            for mode in modes:
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(per_round):
                    if mode == "gkd":
                        seq = collectives.TRACKER.enter("bench", "broadcast", n * 4)
                        dist.broadcast(t, src=0)
                        collectives.TRACKER.leave("bench", seq)
                    else:
                        dist.broadcast(t, src=0)
                results.setdefault((label, mode), []).append((time.perf_counter() - t0) / per_round)
    # one heartbeat's read, the recorder's buffer full by now
    snap = []
    for _ in range(200):
        t0 = time.perf_counter()
        collectives.snapshot()
        snap.append(time.perf_counter() - t0)
    results[("snapshot", modes[-1])] = snap
    dist.barrier()
    rep.close(1.0)
    dist.destroy_process_group()
    if rank == 0:
        out.put(results)


def run(world: int, modes: list[str], rounds: int, per_round: int, fr: bool, sizes: dict[str, int]) -> dict:
    import torch.multiprocessing as mp

    if fr:
        os.environ["TORCH_FR_BUFFER_SIZE"] = "2000"
    else:
        os.environ.pop("TORCH_FR_BUFFER_SIZE", None)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rendezvous = f"file://{tempfile.mkdtemp()}/rendezvous"
    procs = [ctx.Process(target=rank_main, args=(r, world, rendezvous, modes, rounds, per_round, out, sizes))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + 1800
    results = None
    try:
        while results is None:  # a rank that failed leaves the others waiting in a collective: stop at once
            try:
                results = out.get(timeout=1.0)
            except queue.Empty:
                failed = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode not in (None, 0)}
                if failed or time.monotonic() > deadline:
                    raise SystemExit(f"bench_collectives: no results from rank 0 within 1800 s or a rank failed "
                                     f"(rank: exit code {failed}); the ranks' errors are above") from None
    finally:
        for p in procs:
            p.join(60 if results is not None else 0)
            if p.is_alive():
                p.kill()
                p.join(10)
    return results


def fmt(xs: list[float], unit: float = 1e3) -> str:
    return f"{statistics.median(xs) * unit:8.3f} ({min(xs) * unit:.3f}-{max(xs) * unit:.3f})"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--per-round", type=int, default=200)
    p.add_argument("--smoke", action="store_true", help="2 ranks, one round of 5 broadcasts of the smaller tensor, "
                                                        "for CI")
    a = p.parse_args()
    sizes = SIZES
    if a.smoke:
        a.ranks, a.rounds, a.per_round = 2, 1, 5
        sizes = dict(list(SIZES.items())[:1])
    ours = run(a.ranks, ["bare", "gkd"], a.rounds, a.per_round, fr=False, sizes=sizes)
    theirs = run(a.ranks, ["flight recorder"], a.rounds, a.per_round, fr=True, sizes=sizes)
    results = {**ours, **theirs}
    with records.kept("collectives", smoke=a.smoke) as kept_run:
        print(f"{a.ranks} ranks, gloo, {a.rounds} rounds of {a.per_round} broadcasts; ms per broadcast on rank 0, "
              "median (min-max) of the rounds")
        print(f"{'tensor':28} {'way':16} {'ms / broadcast':>26} {'vs bare':>8}")
        for label in sizes:
            bare = statistics.median(results[(label, "bare")])
            for mode in ("bare", "gkd", "flight recorder"):
                xs = results[(label, mode)]
                print(f"{label:28} {mode:16} {fmt(xs):>26} {statistics.median(xs) / bare:7.3f}x")
                if mode != "bare":
                    kept_run.figure(f"{mode}, {label}: against bare", statistics.median(xs) / bare, "x")
        print("\none heartbeat's snapshot(), µs, median (min-max) of 200:")
        print(f"{'our wrapper only':45} {fmt(results[('snapshot', 'gkd')], 1e6)}")
        print(f"{'Flight Recorder, buffer of 2000 full':45} {fmt(results[('snapshot', 'flight recorder')], 1e6)}")
        print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")

if __name__ == "__main__":
    main()
