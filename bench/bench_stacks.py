"""Dumping the stacks of N workers: the agent's parallel capture against N sequential py-spy calls.

    python bench/bench_stacks.py [--workers 16] [--rounds 3]
    python bench/bench_stacks.py --smoke   # for CI: 2 workers, one round

The workers are real Python processes, half asleep in a function and half holding the GIL in a
C loop (the two cases a hung GKD run has). Each way is timed over several rounds, side by side.
The bench fails if a way missed a worker's stack: its time would not be a dump's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.node.stacks import capture_many, py_spy_path  # noqa: E402

WORKER = textwrap.dedent("""
    import re, sys, time
    def sync_rollout_weights():
        print("ready", flush=True)
        if sys.argv[1] == "gil":
            while True:
                re.fullmatch(r"(a|aa)*c", "a" * 40)   # in C, holding the GIL
        time.sleep(3600)
    sync_rollout_weights()
""")


def start_workers(n: int) -> list[subprocess.Popen]:
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, "gil" if i % 2 else "sleep"], stdout=subprocess.PIPE,
                              text=True) for i in range(n)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    return procs


def sequential(pids: list[int], native: bool) -> tuple[float, int]:
    exe = py_spy_path()
    t0 = time.perf_counter()
    ok = 0
    for pid in pids:
        cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else [])
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        ok += "sync_rollout_weights" in out.stdout
    return time.perf_counter() - t0, ok


def parallel(pids: list[int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    caps = capture_many({f"w/{i}": pid for i, pid in enumerate(pids)}, timeout_s=10.0)
    return time.perf_counter() - t0, sum("sync_rollout_weights" in c.text for c in caps.values())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true", help="2 workers (one of each kind), one round, for CI")
    a = p.parse_args()
    if a.smoke:
        a.workers, a.rounds = 2, 1
    procs = start_workers(a.workers)
    pids = [pr.pid for pr in procs]
    try:
        rows = {"sequential py-spy dump": [], "sequential py-spy dump --native": [],
                "gkd agent (parallel, --native)": []}
        found = {}
        for _ in range(a.rounds):
            for name, fn in (("sequential py-spy dump", lambda: sequential(pids, False)),
                             ("sequential py-spy dump --native", lambda: sequential(pids, True)),
                             ("gkd agent (parallel, --native)", lambda: parallel(pids))):
                took, ok = fn()
                rows[name].append(took)
                found[name] = ok
    finally:
        for pr in procs:
            pr.kill()
            pr.wait()
    base = statistics.median(rows["sequential py-spy dump --native"])
    agent = statistics.median(rows["gkd agent (parallel, --native)"])
    with records.kept("stacks", smoke=a.smoke) as run:
        print(f"{'way':34s} {'median':>8s} {'min':>8s} {'max':>8s} {'stacks found':>13s} "
              f"{'vs sequential --native':>23s}")
        for name, times in rows.items():
            med = statistics.median(times)
            print(f"{name:34s} {med:7.2f}s {min(times):7.2f}s {max(times):7.2f}s {found[name]:>7d}/{a.workers:<5d} "
                  f"{base / med:22.1f}x")
        print(f"\n{a.workers} workers (half sleeping, half holding the GIL in C), {a.rounds} rounds, "
              f"{os.cpu_count()} cores")
        run.figure("a node's stacks through the agent (median of a run's rounds)", agent, " s")
        run.figure("the agent against sequential `py-spy dump --native`", base / agent, "x")
    missed = {name: a.workers - n for name, n in found.items() if n < a.workers}
    if missed:
        sys.exit(f"bench_stacks: stacks missed (way: workers without one, in the last round): {missed}; "
                 f"try `{py_spy_path()} dump --pid PID` on a sleeping python to see py-spy's own error")


if __name__ == "__main__":
    main()
