"""A worker's children and CPU read from /proc by hand (``gkd_core/proctree.py``) against psutil, side by side.

    python bench/bench_proc_reads.py [--others 300] [--rounds 7]
    python bench/bench_proc_reads.py --smoke   # for CI: 20 other processes, 3 rounds, not recorded

Why it is measured: psutil comes with Ray, and would spare the hand-written reads. Each heartbeat of a worker
reads its children (an inference engine works in them) and their CPU. ``psutil.Process.children()`` walks
every process of the machine (a Ray node has hundreds) where ``proctree.children`` reads
``/proc/PID/task/*/children``; so the bench times both on a process with 24 threads and 3 children, first on
the machine as it is, then with ``--others`` idle processes more (another process's children: the measured
one keeps its 3), the answers checked equal.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import timeit
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core import proctree  # noqa: E402

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]
# starts the other processes and exits, saying their pids: orphans then, not the measured process's descendants
# (the machine's processes grow, the measured process's children stay its 3)
STARTER = ("import subprocess\n"
           "print(' '.join(str(subprocess.Popen({sleeper!r}, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
           "stderr=subprocess.DEVNULL, start_new_session=True).pid) for _ in range({n})))\n")


def timed(fn, calls: int, rounds: int) -> tuple[float, float, float]:
    """(median, min, max) over ``rounds`` of one call's microseconds."""
    runs = [timeit.timeit(fn, number=calls) / calls * 1e6 for _ in range(rounds)]
    return statistics.median(runs), min(runs), max(runs)


def measure(me: psutil.Process, rounds: int) -> dict[str, tuple[float, float, float]]:
    pid = me.pid
    assert sorted(proctree.children(pid)) == sorted(c.pid for c in me.children()), "the two ways disagree"
    return {
        "children: proctree": timed(lambda: proctree.children(pid), 200, rounds),
        "children: psutil": timed(lambda: me.children(), 200, rounds),
        "cpu: proctree": timed(lambda: proctree.cpu_seconds(pid), 2000, rounds),
        "cpu: psutil": timed(lambda: me.cpu_times(), 2000, rounds),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--others", type=int, default=300, help="idle processes started for the second half")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--smoke", action="store_true")
    a = p.parse_args()
    if a.smoke:
        a.others, a.rounds = 20, 3
    stop = threading.Event()
    for _ in range(24):
        threading.Thread(target=stop.wait, daemon=True).start()
    kids = [subprocess.Popen(SLEEPER, stdin=subprocess.DEVNULL) for _ in range(3)]
    others: list[int] = []
    me = psutil.Process(os.getpid())
    try:
        time.sleep(0.3)
        halves = {}
        halves[len(psutil.pids())] = measure(me, a.rounds)
        started = subprocess.run([sys.executable, "-c", STARTER.format(sleeper=SLEEPER, n=a.others)],
                                 capture_output=True, text=True, timeout=120, check=True)
        others = [int(pid) for pid in started.stdout.split()]
        time.sleep(0.5)
        assert len(me.children()) == len(kids), "the others are the measured process's children"
        halves[len(psutil.pids())] = measure(me, a.rounds)
    finally:
        for pid in others:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for child in kids:
            child.kill()
            child.wait()
        stop.set()
    print("halves: proctree, psutil")
    with records.kept("proc_reads", smoke=a.smoke) as run:
        print(f"{'processes':>9s} {'read':10s} {'proctree µs':>22s} {'psutil µs':>22s} {'psutil/proctree':>16s}")
        for n, rows in halves.items():
            for read in ("children", "cpu"):
                mine, theirs = rows[f"{read}: proctree"], rows[f"{read}: psutil"]
                print(f"{n:9d} {read:10s} {mine[0]:9.1f} ({mine[1]:.1f}-{mine[2]:.1f}) "
                      f"{theirs[0]:9.1f} ({theirs[1]:.1f}-{theirs[2]:.1f}) {theirs[0] / mine[0]:15.1f}x")
        print(f"\na process of 24 threads and 3 children; the median of {a.rounds} rounds (min-max), "
              f"{os.cpu_count()} cores")
        most = max(halves)
        run.figure(f"psutil's children() against proctree's, {most} processes",
                   halves[most]["children: psutil"][0] / halves[most]["children: proctree"][0], "x")


if __name__ == "__main__":
    main()
