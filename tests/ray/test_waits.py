"""A driver's wait on other workers (gkd_core/integrations/waits.py), on real Ray object refs: who has
answered, a weight sync said as a sync, and the waits Ray allows that are not syncs."""

from __future__ import annotations

import time

import pytest
import ray

from gkd_core.integrations.waits import RefBook, Wait


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


@ray.remote(num_cpus=0)
def answer(after_s: float) -> int:
    time.sleep(after_s)
    return 1


def test_a_sync_named_twice_in_one_get_is_one_call_and_says_who_has_answered(local_ray):
    book, said = RefBook(), []
    fast, slow = answer.remote(0.0), answer.remote(3.0)
    book.sent("rollout/0", "sync_rollout_weights", fast)
    book.sent("rollout/1", "sync_rollout_weights", slow)
    ray.get(fast)
    wait = Wait(book, [fast, slow, slow], said.append, 60.0, 7)  # ray.get([r, r]) is legal; ray.wait([r, r]) not
    assert wait.resolve().is_sync and len(wait.refs) == 2  # (worked out when first asked: the watcher's tick)
    assert wait.progress() == "1 of 2 answered; waiting for rollout/1.sync_rollout_weights"
    assert said[-1].state == "started" and said[-1].pending == ["rollout/1"] and said[-1].done == ["rollout/0"]
    ray.get(slow)
    wait.ended(None)
    assert said[-1].state == "done" and said[-1].pending == [] and said[-1].step == 7


def test_a_ray_wait_that_may_return_on_the_first_answer_is_no_sync(local_ray):
    book, said = RefBook(), []
    refs = [answer.remote(0.0), answer.remote(2.0)]
    for i, r in enumerate(refs):
        book.sent(f"rollout/{i}", "sync_rollout_weights", r)
    wait = Wait(book, refs, said.append, 60.0, None, whole=False)
    assert not wait.resolve().is_sync
    ray.wait(refs, num_returns=1)
    wait.progress()
    wait.ended(None)  # one answered, one not: nothing says the sync ended
    assert said == []
