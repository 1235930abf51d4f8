"""What watching a plain Ray job costs it: a job of many small calls, with and without `gkd-tui launch --`.

    python bench/bench_ray_watch.py [--rounds 3] [--calls 2000]
    python bench/bench_ray_watch.py --smoke   # for CI: one round each way, 200 calls; nothing recorded

The job (this file, ``--job``) makes two Caller and two Callee actors; each Caller makes CALLS calls, one
at a time, each a ``ray.get`` on a Callee's method that returns at once, while the driver waits on the
Callers; then the driver itself makes CALLS calls of its own the same way. Every call is a phase and every
``ray.get`` a wait with its edge in the wait-for graph (the phase event's ``waits_on``), in every process
of the job: the most the watching can cost a job, whose calls are usually far longer. The job times its
own loop, after ``ray.init`` and its actors' start (which the watching also slows by its set-up, once).

Without: ``python bench_ray_watch.py --job CALLS``. With: the same under ``gkd-tui launch --detach --linger 0
--``: the supervisor, Ray's hooks in every worker, the diagnosis. Rounds alternate the two, so that both
see the same machine; the ratio is the median of each round's with/without.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import records  # bench/records.py, beside this file

ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 600  # a round is well under a minute here; one still going after this is stuck


def job(calls: int) -> None:
    import ray

    @ray.remote(num_cpus=0)
    class Callee:
        def answer(self, i: int) -> int:
            return i

    @ray.remote(num_cpus=0)
    class Caller:
        def __init__(self, callee):
            self.callee = callee

        def run(self, n: int) -> int:
            return sum(ray.get(self.callee.answer.remote(i), timeout=60) for i in range(n))

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
    callees = [Callee.remote() for _ in range(2)]
    callers = [Caller.remote(c) for c in callees]
    ray.get([c.run.remote(1) for c in callers], timeout=LIMIT_S)  # every actor up
    t0 = time.perf_counter()
    ray.get([c.run.remote(calls) for c in callers], timeout=LIMIT_S)
    for i in range(calls):
        ray.get(callees[i % 2].answer.remote(i), timeout=60)
    print(f"LOOP_S {time.perf_counter() - t0:.4f}", flush=True)
    ray.shutdown()


def loop_s(output: str, what: str) -> float:
    found = re.search(r"LOOP_S ([\d.]+)", output)
    if not found:
        raise SystemExit(f"bench_ray_watch: the job {what} printed no time: {output[-2000:]}")
    return float(found[1])


def ended(run: Path) -> bool:
    """Whether the run's log says it ended (its command exited, or failed to start)."""
    log = run / "events.jsonl"
    lines = log.read_text().splitlines() if log.exists() else []
    return any('"kind":"run"' in line and any(f'"state":"{s}"' in line for s in ("finished", "failed", "stopped"))
               for line in lines)


def without(calls: int) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GKD_") and k != "RAY_RUNTIME_ENV_HOOK"}
    got = subprocess.run([sys.executable, __file__, "--job", str(calls)], capture_output=True, text=True, env=env,
                         timeout=LIMIT_S, cwd=ROOT)
    return loop_s(got.stdout + got.stderr, "unwatched")


def watched(calls: int, home: Path) -> float:
    env = dict(os.environ, GKD_HOME=str(home))
    got = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "launch", "--detach", "--linger", "0", "--",
                          sys.executable, __file__, "--job", str(calls)], capture_output=True, text=True, env=env,
                         timeout=60, cwd=ROOT)
    if got.returncode != 0:
        raise SystemExit(f"bench_ray_watch: launch failed: {got.stderr[-2000:]}")
    run = (home / "runs" / "latest").resolve()  # the run launch just made
    log = run / "logs" / "driver.log"
    deadline = time.monotonic() + LIMIT_S
    while time.monotonic() < deadline and "LOOP_S" not in (log.read_text() if log.exists() else ""):
        if ended(run):
            break  # the job ended without its time: said below, with its output
        time.sleep(0.5)
    # the run ends with its command (the job shuts its Ray down): waited for, so that the next round has the
    # cores; then stopped, in case it did not
    finish = time.monotonic() + 60
    while time.monotonic() < finish and not ended(run):
        time.sleep(0.5)
    subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(run)], capture_output=True, env=env, timeout=60,
                   cwd=ROOT)
    return loop_s(log.read_text() if log.exists() else "", f"under launch ({run.name})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--job", type=int, help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=2000, help="calls by each Caller, and by the driver")
    p.add_argument("--smoke", action="store_true", help="one round each way of 200 calls: for CI; nothing recorded")
    a = p.parse_args()
    if a.job is not None:
        job(a.job)
        return
    if a.smoke:
        a.rounds, a.calls = 1, 200
    rows = []
    with tempfile.TemporaryDirectory(prefix="gkd-bench-watch-") as tmp:
        for i in range(a.rounds):
            plain = without(a.calls)
            seen = watched(a.calls, Path(tmp))
            rows.append((plain, seen))
            print(f"round {i + 1}: without {plain:.2f} s, with {seen:.2f} s, {seen / plain:.3f}x", flush=True)
    with records.kept("ray_watch", smoke=a.smoke) as kept_run:
        ratios = [s / p for p, s in rows]
        print(f"\n{a.calls} calls by each of 2 actors, then {a.calls} by the driver, each a ray.get on an actor call "
              f"that returns at once; {a.rounds} round(s), alternated")
        print(f"{'':10s} {'without (s)':>12s} {'with (s)':>10s} {'with / without':>15s}")
        for i, (plain, seen) in enumerate(rows, 1):
            print(f"{'round ' + str(i):10s} {plain:12.2f} {seen:10.2f} {seen / plain:14.3f}x")
        middle = statistics.median(ratios)
        print(f"{'median':10s} {statistics.median(p for p, _ in rows):12.2f} "
              f"{statistics.median(s for _, s in rows):10.2f} {middle:14.3f}x")
        print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")
        kept_run.figure("a job of small calls, watched against not (median of the rounds)", middle, "x")


if __name__ == "__main__":
    main()
