"""What the memory readings cost a heartbeat: the same heartbeat built with them and without, in one run.

    python bench/bench_memory.py [--rounds 5] [--beats 2000]
    python bench/bench_memory.py --smoke   # for CI: 2 rounds of 200; nothing recorded

A heartbeat is what a worker's Reporter sends once a second (``Reporter._heartbeat``: its phase, RSS, CPU,
encoded). With the memory readings it also reads the scope that limits the process (its cgroup's limit,
use and OOM kills up its tree, or the node's) and the node's MemAvailable (gkd_core.memory: a few small
files under /proc and the cgroup filesystem); its RSS with its children's comes from the /proc/PID/stat it
already read for their CPU (proctree), so it costs nothing more. Without: the same Reporter whose memory
probe reads nothing. The rounds alternate the two; each figure is the median of the rounds (min-max), in
microseconds a heartbeat, and for a node of 8 workers, each beating once a second, as a share of a core.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # bench/records.py, beside this file  # noqa: E402

from gkd_core import memory  # noqa: E402
from gkd_core.telemetry.reporter import Reporter  # noqa: E402

WORKERS_A_NODE = 8


class NoMemory:
    """The probe that reads nothing: the heartbeat as it was without the memory readings."""

    def sample(self) -> tuple[None, int]:
        return None, 0


def per_beat_us(reporter: Reporter, beats: int, before=None) -> float:
    """Microseconds a heartbeat; ``before`` (untimed apart from it: it only clears a cache) before each."""
    t0 = time.perf_counter()
    for _ in range(beats):
        if before is not None:
            before()
        reporter._heartbeat(12.5, 1 << 30)
    return 1e6 * (time.perf_counter() - t0) / beats


def forget_node_kills(probe: memory.MemoryProbe):
    def forget():
        probe._node_kills_at = float("-inf")
    return forget


def forget_cgroup(probe: memory.MemoryProbe):
    def forget():
        probe._resolved = float("-inf")
    return forget


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--beats", type=int, default=2000)
    p.add_argument("--smoke", action="store_true", help="2 rounds of 200 beats: for CI; nothing recorded")
    a = p.parse_args()
    if a.smoke:
        a.rounds, a.beats = 2, 200
    with_mem = Reporter("bench/0", ingest="", start=False)
    without = Reporter("bench/1", ingest="", start=False)
    without._memory = NoMemory()
    limit, available = memory.MemoryProbe().sample()
    per_beat_us(with_mem, 50), per_beat_us(without, 50)  # warm
    # the readings' caches are of time (the node's kills every 5 s, the cgroup found again every 30 s): a beat
    # a second meets them that often, and a loop of beats never would; each is timed on its own and weighed
    probe = with_mem._memory
    rows = []
    for _ in range(a.rounds):
        plain = per_beat_us(without, a.beats)
        steady = per_beat_us(with_mem, a.beats)
        kills = per_beat_us(with_mem, a.beats, forget_node_kills(probe))
        resolve = per_beat_us(with_mem, a.beats, forget_cgroup(probe))
        read = (steady + (kills - steady) / probe.NODE_KILLS_EVERY_S * (limit is not None and limit.where == "node")
                + (resolve - steady) / memory.RESOLVE_EVERY_S)
        rows.append((plain, read))
        print(f"round: without {plain:.1f} us; with: {steady:.1f} a beat, {kills:.1f} with the node's kills, "
              f"{resolve:.1f} with the cgroup found again; {read:.1f} at a beat a second", flush=True)
    with records.kept("memory", smoke=a.smoke) as kept_run:
        print(f"a heartbeat built and encoded, {a.beats} a round, {a.rounds} rounds alternated; "
              f"median (min-max) in microseconds")
        added = [r - p for p, r in rows]

        def cell(values: list[float]) -> str:
            return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

        print(f"{'without the memory readings':34s} {cell([p for p, _ in rows]):>22s}")
        print(f"{'with them (at a beat a second)':34s} {cell([r for _, r in rows]):>22s}")
        print(f"{'added by the readings':34s} {cell(added):>22s}")
        node_pct = 100 * statistics.median(added) * WORKERS_A_NODE / 1e6
        print(f"a node of {WORKERS_A_NODE} workers beating once a second: {node_pct:.3f} % of a core for the readings")
        scope = "none readable" if limit is None else ("the node" if limit.where == "node" else "a cgroup")
        print(f"\nthe scope read here: {scope}; {os.cpu_count()} cores, Python {sys.version.split()[0]}")
        kept_run.figure("the memory readings, added to a heartbeat", statistics.median(added), " us")
        kept_run.figure("a heartbeat with them", statistics.median([r for _, r in rows]), " us")


if __name__ == "__main__":
    main()
