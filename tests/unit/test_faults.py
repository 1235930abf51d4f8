"""The fault plan: typed faults routed to the worker they strike, each firing when it should."""

from __future__ import annotations

import json
import os
import pickle
import signal
import time

import msgspec
import pytest

from gkd_core.config import load_config
from gkd_core.trainer.faults import FaultPlan, arm, arm_fault


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


def test_an_armed_signal_fires_once_from_the_student_and_says_when(tmp_path):
    """The random trials arm a signal for the start of the student's next sync: only the student is given the file
    to look for, it fires once (claimed by a rename), and ``armed.fired`` says when and by whom."""
    p = plan()
    assert p.for_worker("rollout/0", tmp_path).armed == "" and p.for_worker("student/0").armed == ""
    student = p.for_worker("student/0", tmp_path)
    said: list[str] = []
    student.fire_armed("student/0", said.append, lambda: None)  # nothing armed: nothing done
    assert said == [] and not (tmp_path / "faults").exists()

    fired = arm(tmp_path, os.getpid(), signal.SIGCONT)  # a signal this process shrugs off
    before = time.time()
    student.fire_armed("student/0", said.append, lambda: None)
    student.fire_armed("student/0", said.append, lambda: None)  # once
    assert len(said) == 1 and "sends SIGCONT to pid" in said[0]
    when = json.loads(fired.read_text())
    assert when["by"] == "student/0" and when["signal"] == "SIGCONT" and when["ts"] >= before
    assert list((tmp_path / "faults").iterdir()) == [fired]

    (tmp_path / "faults" / "armed.json").write_text('{"pid": 1, "signal": "SIGNOPE"}')  # not a signal: said
    student.fire_armed("student/0", said.append, lambda: None)
    assert "fault not fired" in said[-1] and "SIGNOPE" in said[-1]


def test_a_fault_armed_for_one_worker_is_claimed_by_it_at_its_next_point_and_says_when_it_strikes(tmp_path):
    """The random trials arm a fault of the config's kinds for one worker while the run goes on: only that worker
    claims it, as a fault of the step it is at, once; ``SRC.fired`` says when it struck, not when it was claimed."""
    p = plan()
    rollout, other = p.for_worker("rollout/1", tmp_path), p.for_worker("rollout/0", tmp_path)
    said: list[str] = []
    assert rollout.claim_armed("rollout/1", 5, said.append) is None and said == []  # nothing armed: a stat

    fired = arm_fault(tmp_path, "rollout/1", "hang_sync", seconds=20)
    assert other.claim_armed("rollout/0", 7, said.append) is None  # not its own
    f = rollout.claim_armed("rollout/1", 7, said.append)
    assert (f.kind, f.step, f.target, f.seconds) == ("hang_sync", 7, "rollout/1", 20)
    assert rollout.claim_armed("rollout/1", 7, said.append) is None and not fired.exists()  # once; not struck yet
    assert rollout.take("hang_sync", 6) is None and not fired.exists()
    before = time.time()
    assert rollout.take("hang_sync", 7) is f
    struck = json.loads(fired.read_text())
    assert (struck["src"], struck["kind"]) == ("rollout/1", "hang_sync") and struck["ts"] >= before

    arm_fault(tmp_path, "rollout/1", "slow_worker", factor=2.0, seconds=0.2)  # a lasting one: for its seconds
    rollout.claim_armed("rollout/1", 9, said.append)
    assert [rollout.slow_factor(s) for s in (8, 9, 10)] == [0.0, 2.0, 2.0]
    time.sleep(0.25)
    assert rollout.slow_factor(11) == 0.0

    armed = tmp_path / "faults" / "armed" / "rollout-1.json"
    armed.write_text('{"kind": "no_such_fault"}')  # not a fault: said, set aside, nothing armed
    assert rollout.claim_armed("rollout/1", 12, said.append) is None
    assert "fault not armed" in said[-1] and not armed.exists()
    with pytest.raises(msgspec.ValidationError):
        arm_fault(tmp_path, "rollout/1", "hang_sync", sceonds=3)  # refused where it is armed, not in the worker
