"""A ``/metrics`` scrape of a large run: its size and the time the supervisor's loop spends making it, per size.

    python bench/bench_metrics.py [--workers 4096 65536 131072] [--rounds 5]
    python bench/bench_metrics.py --smoke     # 1,024 workers, one round (CI)

A run's state of N workers, 8 a node (a phase each, a heartbeat, memory, a sync under way, the teacher's
counts, a GPU per worker, an alert on one of them: what the scale bench's load leaves in a state), scraped
the way Prometheus does: the families made from the state on the loop (``supervisor/metrics.families``, the
part that holds the supervisor's loop) and written as the text format (``generate_latest``, on the HTTP
server's thread). The goal (#56): at 65,536 workers, under 1 MB and under 100 ms by default.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import records  # noqa: E402  (bench/records.py, beside this file)
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from gkd_core.state import RunState  # noqa: E402
from gkd_core.supervisor.metrics import WORKERS_MAX, SupervisorCounts, families  # noqa: E402
from gkd_core.telemetry import events as ev  # noqa: E402

T0 = 1_795_000_000.0
PER_NODE = 8


def large_run(workers: int) -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(src="supervisor", state="running", ts=T0, run="bench"))
    for i in range(workers):
        src, node = f"rollout/{i}", f"node-{i // PER_NODE}"
        st.apply(ev.WorkerEvent(src=src, role="rollout", rank=i, node=node, pid=1000 + i, ts=T0))
        st.apply(ev.PhaseEvent(src=src, phase="generate" if i % 3 else "sync_weights", step=41, ts=T0 + 1))
        st.apply(ev.HeartbeatEvent(src=src, ts=T0 + 2, rss=(1 << 30) + i, cpu=50.0))
        st.apply(ev.GpuEvent(src=f"agent/{node}", node=node, index=i % PER_NODE, util=80.0, mem_used=1 << 34,
                             mem_total=80 << 30, ts=T0 + 2))
    st.apply(ev.SyncEvent(src="driver", sync_id=41, state="started", timeout_s=600.0, pending=["rollout/7"], ts=T0 + 1))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=10_000, completed=9_990, in_flight=10, ts=T0 + 2))
    st.apply(ev.AlertEvent(src="supervisor", severity="critical", code="straggler", targets=[f"rollout/{workers - 1}"],
                           message="late", ts=T0 + 10))
    return st


class Made:
    def __init__(self, made):
        self.made = made

    def collect(self):
        return self.made


def scrape(st: RunState) -> tuple[float, float, int]:
    """(ms on the loop making the families, ms writing the text, bytes)."""
    began = time.perf_counter()
    made = families(st, T0 + 20, SupervisorCounts(events=123_456))
    on_loop = time.perf_counter() - began
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Made(made))
    began = time.perf_counter()
    text = generate_latest(registry)
    return 1000 * on_loop, 1000 * (time.perf_counter() - began), len(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", type=int, nargs="+", default=[4096, 65536, 131072])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="1,024 workers, one round: for CI")
    a = p.parse_args()
    if a.smoke:
        a.workers, a.rounds = [1024], 1
    with records.kept("metrics", smoke=a.smoke) as kept_run:
        print(f"{'workers':>8s} {'on the loop ms':>22s} {'writing ms':>22s} {'scrape KB':>10s}  "
              "(median (min-max) of rounds)")
        for n in a.workers:
            st = large_run(n)
            runs = [scrape(st) for _ in range(a.rounds)]
            loop, write, size = ([r[i] for r in runs] for i in range(3))
            print(f"{n:8d} {_spread(loop):>22s} {_spread(write):>22s} {statistics.median(size) / 1024:10.1f}")
            kept_run.figure(f"{n} workers: a scrape's time on the supervisor's loop", statistics.median(loop), " ms")
            kept_run.figure(f"{n} workers: a scrape's size", statistics.median(size) / 1024, " KB")
        print(f"\n{a.rounds} round(s); per-worker series for at most {WORKERS_MAX} workers, the rest by role and "
              f"phase; 8 workers a node")


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.1f} ({min(xs):.1f}-{max(xs):.1f})"


if __name__ == "__main__":
    main()
