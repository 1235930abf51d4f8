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


def test_a_call_noted_by_its_method_alone_is_named_by_the_actor_its_ref_was_made_for():
    """The actor call's wrapper stores the method only: the actor is in the ref (its task's actor id), named
    only when a wait asks; a ref the book never had, or one of a task, names nobody."""
    from ray._raylet import ActorID, JobID, ObjectRef, TaskID

    job = JobID.from_int(1)
    driver = TaskID.for_driver_task(job)
    actors = [ActorID.of(job, driver, i) for i in (1, 2)]

    def ref_of(actor: ActorID, call: int) -> ObjectRef:  # the first return of the actor's call
        return ObjectRef(TaskID.for_actor_task(job, driver, call, actor).binary() + (1).to_bytes(4, "little"))

    asked: list[str] = []
    names = {actors[0].hex(): "Inference/0", actors[1].hex(): "Trainer/0"}
    book = RefBook(lambda actor_id: asked.append(actor_id) or names[actor_id])
    generate, ready = ref_of(actors[0], 3), ref_of(actors[1], 4)
    book.note("generate", generate)
    book.note("weights_ready", [ready])  # (a call of several returns gives a list)
    assert book.who(generate) == ("Inference/0", "generate")
    assert book.who(ready) == ("Trainer/0", "weights_ready")
    assert asked == [actors[0].hex(), actors[1].hex()]
    assert book.who(ref_of(actors[0], 5)) is None  # never noted
    assert book.who(ObjectRef(TaskID.for_normal_task(job, driver, 6).binary() + (1).to_bytes(4, "little"))) is None
