"""A node's GPU readings sent when they say something new (gkd_core/node/gpu_deadband.py): a training run's
steady GPUs send a batch a node every GPU_FULL_S, while what a rule reads or a person sees move is sent at
once, and the rules name what they named when every reading was sent, as soon."""

from __future__ import annotations

import random

import pytest

from gkd_core import diagnosis
from gkd_core.diagnosis.gpu_index import GPU_FRESH_S
from gkd_core.diagnosis.rules.gpu import GPU_IDLE_FULL_S, GPU_SPREAD
from gkd_core.node.gpu_deadband import MEM_STEP, UTIL_STEP, GpuDeadband, reading_of
from gkd_core.state import RunState
from gkd_core.state.records import GPU_FULL
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.beats import GPU_FULL_S

GIB = 1 << 30
T0 = 1_000_000.0


def reading(index: int = 0, util: float = 97.0, mem: int = 60 * GIB, temp: float = 70.0,
            power: float = 600.0) -> ev.GpuEvent:
    return ev.GpuEvent(index=index, uuid=f"GPU-{index}", util=util, mem_used=mem, mem_total=80 * GIB, temp=temp,
                       power=power, pids=[4121], proc_mem={"4121": mem})


def test_a_steady_gpu_is_sent_first_then_in_full_every_gpu_full_period():
    band = GpuDeadband()
    rnd = random.Random(0)
    sent = []
    for s in range(0, 60, 2):  # a training GPU: 95-99 %, its memory and power breathing a little
        g = reading(util=rnd.uniform(95, 99), mem=60 * GIB + rnd.randrange(256 << 20), temp=rnd.uniform(69, 71),
                    power=rnd.uniform(580, 620))
        sent += [s for _ in band.new([g], T0 + s)]
    assert sent == [0, 30]  # of 30 samples


@pytest.mark.parametrize("change", [
    {"util": 97.0 - UTIL_STEP},  # utilisation by a step
    {"util": 0.0, "was_util": 3.0},  # across 0: the GPU stopped computing
    {"mem": 60 * GIB + 80 * GIB // MEM_STEP},  # memory by 1/64 of the GPU's
    {"mem": int(GPU_FULL * 80 * GIB), "was_mem": int(GPU_FULL * 80 * GIB) - 1},  # across GPU_FULL
    {"pids": [4121, 5000]},  # another process on it
    {"temp": 74.0},
    {"power": 680.0},
    {"error": "GPU has fallen off the bus"},
])
def test_what_a_rule_reads_or_a_person_sees_move_is_sent_at_once(change):
    band = GpuDeadband()
    was = reading(util=change.pop("was_util", 97.0), mem=change.pop("was_mem", 60 * GIB))
    assert band.new([was], T0) == [was]
    assert band.new([was], T0 + 2) == []  # the same: nothing
    fields = {k: change[k] for k in ("util", "mem") if k in change}
    now = reading(**{"util": was.util, "mem": was.mem_used, **fields})
    for k in ("pids", "temp", "power", "error"):
        if k in change:
            setattr(now, k, change[k])
    now.proc_mem = dict(was.proc_mem) if "mem" not in change else now.proc_mem
    assert band.new([now], T0 + 4) == [now]


def test_the_same_processes_listed_in_another_order_are_nothing_new():
    band = GpuDeadband()
    was, now = reading(), reading()
    was.pids, now.pids = [4121, 5000], [5000, 4121]
    assert band.new([was], T0) == [was] and band.new([now], T0 + 2) == []


def test_after_a_note_about_the_node_every_gpu_is_sent_again():
    band = GpuDeadband()
    gs = [reading(i) for i in range(8)]
    assert band.new(gs, T0) == gs and band.new(gs, T0 + 2) == []
    band.forget()  # (an NVML error, a call that hung: the readings that follow take its banner down)
    assert band.new(gs, T0 + 4) == gs


def test_the_deadband_leaves_the_gpu_rules_every_reading_where_they_judge():
    """The full readings come well within the rules' freshness; the step is far below the spread they name."""
    assert GPU_FULL_S * 2 < GPU_FRESH_S
    assert UTIL_STEP * 5 <= GPU_SPREAD


def test_the_gpu_rules_name_through_the_deadband_what_they_name_from_every_reading():
    """A node of 8 GPUs, busy for two minutes, then GPU 5 full of memory at 0 % (a hung collective) and GPU 6
    at a third of the others (an uneven split): named at the same second whether every reading is sent or only
    the new ones, as one ``gpus`` batch each."""
    def run(band: GpuDeadband | None) -> tuple[dict[str, float], int]:
        st = RunState()
        st.apply(ev.RunEvent(state="running", ts=T0))
        rnd = random.Random(1)
        first: dict[str, float] = {}
        sent = 0
        for s in range(0, 300, 2):
            gs = [reading(i, util=0.0 if i == 5 and s >= 120 else rnd.uniform(30, 34) if i == 6 and s >= 120
                          else rnd.uniform(95, 99), mem=(79 if i == 5 and s >= 120 else 60) * GIB)
                  for i in range(8)]
            new = gs if band is None else band.new(gs, T0 + s)
            sent += len(new)
            if new:
                st.apply(ev.GpusEvent(src="agent/n0", node="n0", ts=T0 + s, readings=[reading_of(g) for g in new]))
            for t in (s + 0.5, s + 1.5):
                for a in diagnosis.diagnose(st, T0 + t):
                    first.setdefault(a.code, t)
        return first, sent

    every, all_sent = run(None)
    banded, few_sent = run(GpuDeadband())
    assert set(every) == {"gpu_idle_full", "gpu_unbalanced"}, every
    assert every["gpu_idle_full"] == pytest.approx(120 + GPU_IDLE_FULL_S + 0.5, abs=2.5)
    # the same second for the full GPU; the unbalanced, judged on a minute's averages that move as readings come,
    # within a full period of it (180.5 s and 165.5 s: the steady readings come every GPU_FULL_S)
    assert banded["gpu_idle_full"] == every["gpu_idle_full"]
    assert abs(banded["gpu_unbalanced"] - every["gpu_unbalanced"]) <= GPU_FULL_S, (banded, every)
    assert few_sent * 10 < all_sent, (few_sent, all_sent)  # (80 of 1,200)
