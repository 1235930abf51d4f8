"""bench/bench_ettr.py's measure: a step that spans a fault's stall (a worker replaced in place, the step waiting
for it) keeps only its time outside the stall; without stalls, its whole time from the step before."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from bench_ettr import kept_time  # noqa: E402


def test_a_step_that_waited_for_a_replaced_worker_keeps_only_its_time_outside_the_stall():
    events = [{"kind": "run", "state": "running", "ts": 0.0},
              {"kind": "metrics", "step": 1, "ts": 1.0, "timing": {"train": 1.0}},
              {"kind": "metrics", "step": 2, "ts": 2.0},
              {"kind": "metrics", "step": 3, "ts": 23.0},  # a fault at 2.5, the run back at 22.5
              {"kind": "metrics", "step": 4, "ts": 24.0}]
    assert kept_time(events, 100.0) == (24.0, 4, 0)  # (as measured before: the wait counted)
    kept_s, kept, lost = kept_time(events, 100.0, [(2.5, 22.5)])
    assert (round(kept_s, 6), kept, lost) == (4.0, 4, 0)
