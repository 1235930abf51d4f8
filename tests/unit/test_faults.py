"""The fault plan: typed faults routed to the worker they strike, each firing when it should."""

from __future__ import annotations

import pickle

from gkd_core.config import load_config
from gkd_core.trainer.faults import FaultPlan


def plan(*faults: str, restart: int = 0) -> FaultPlan:
    return FaultPlan.for_run(load_config(None, [f"faults=[{', '.join(faults)}]"]).faults, restart)


def test_each_worker_gets_its_own_and_the_driver_keeps_its_own():
    p = plan("{kind: hang_sync, target: rollout/1, step: 3}", "{kind: nan_grad, step: 2, repeat: 2}",
             "{kind: kill_teacher, step: 4, seconds: 5}", "{kind: disk_full, step: 5, repeat: 2}",
             "{kind: hang_nvml, step: 7}")
    assert [f.kind for f in p.for_worker("rollout/1").faults] == ["hang_sync"]
    assert [f.kind for f in p.for_worker("student/0").faults] == ["nan_grad"]  # whatever its target
    assert p.for_worker("rollout/0").faults == []
    assert p.at("kill_teacher", 4).seconds == 5 and p.at("kill_teacher", 3) is None
    assert [p.disk_full(s) for s in (4, 5, 6, 7)] == [False, True, True, False]
    assert p.gpu_backend("nvml") == "fake:gpus=1,hang_at=7" and plan().gpu_backend("nvml") == "nvml"
    assert plan("{kind: hang_sync, target: rollout/1, step: 3}", restart=1).faults == []  # a restart gets past


def test_a_step_fault_fires_once_and_travels_to_an_actor_by_pickle():
    mine = pickle.loads(pickle.dumps(plan("{kind: hang_sync, target: rollout/1, step: 3}").for_worker("rollout/1")))
    assert mine.take("hang_sync", 2) is None
    assert mine.take("hang_sync", 3).step == 3 and mine.take("hang_sync", 3) is None


def test_nan_grad_for_repeat_steps_and_a_slow_worker_from_its_step():
    student = plan("{kind: nan_grad, step: 2, repeat: 2}").for_worker("student/0")
    assert [student.nan_grad(s) for s in range(1, 6)] == [False, True, True, False, False]
    slow = plan("{kind: slow_worker, target: rollout/0, step: 3, factor: 0.5}").for_worker("rollout/0")
    assert [slow.slow_factor(s) for s in (2, 3, 9)] == [0.0, 0.5, 0.5]
