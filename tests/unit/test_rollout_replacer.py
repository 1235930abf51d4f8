"""trainer/replacing: a call that waits on the rollouts, done again after a rollout that died in it is replaced
(trainer.replace_rollouts), its ``again`` first; anything else (a failure of a live worker, a dead student, the
option off, a worker that dies at every try) stays the run's failure. Ray's part, on a real run:
tests/ray/test_replace_in_place.py."""

from __future__ import annotations

import pytest

from gkd_core.trainer import replacing
from gkd_core.trainer.guarded import WorkerFailed
from gkd_core.trainer.replacing import REPLACES_PER_CALL, RolloutReplacer


@pytest.fixture
def replaced(monkeypatch) -> list[list[str]]:
    got: list[list[str]] = []
    monkeypatch.setattr(replacing, "replace_rollouts", lambda cluster, dead: got.append(dead))
    return got


def failing(*failures: WorkerFailed):
    """A call that raises each of ``failures`` in turn, then answers how many times it was called."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return len(calls)
    return call


def died(name: str) -> WorkerFailed:
    return WorkerFailed(f"{name} died", name, died=True)


def test_a_dead_rollout_is_replaced_and_the_call_done_again_after_its_again(replaced):
    order: list[str] = []
    call = failing(died("rollout/1"))
    assert RolloutReplacer(None, enabled=True).retried(lambda: order.append("call") or call(),
                                                      lambda: order.append("again")) == 2
    assert replaced == [["rollout/1"]] and order == ["call", "again", "call"]


@pytest.mark.parametrize("failure, enabled", [
    (died("rollout/1"), False),  # the option off: the run fails, a restart resumes from a checkpoint
    (WorkerFailed("rollout/1 failed in generate: ValueError", "rollout/1"), True),  # alive, and raised: a bug
    (died("student/0"), True),  # the student holds the optimizer's state: the whole run restarts
    (died("teacher/0"), True),  # (the teacher is started again where the driver waits on it, not here)
])
def test_anything_but_a_dead_rollout_with_the_option_on_stays_the_runs_failure(replaced, failure, enabled):
    with pytest.raises(WorkerFailed):
        RolloutReplacer(None, enabled=enabled).retried(failing(failure))
    assert replaced == []


def test_a_rollout_that_dies_at_every_try_fails_the_call_after_the_last_replacement(replaced):
    failures = [died("rollout/0") for _ in range(REPLACES_PER_CALL + 1)]
    with pytest.raises(WorkerFailed):
        RolloutReplacer(None, enabled=True).retried(failing(*failures))
    assert len(replaced) == REPLACES_PER_CALL
