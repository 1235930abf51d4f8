"""What a dump's answer says of the stacks it could not take on another node (gkd_core/integrations/
remote_stacks.py); the real dump across nodes is tests/ray/test_multinode.py. This tier starts no Ray: Ray is
imported, never started, so each call of Ray's refuses for real, as in a driver whose Ray is gone."""

from __future__ import annotations

import pytest

from gkd_core.integrations import remote_stacks
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops

NODE = "ab" * 28  # a Ray node id (28 bytes, in hex)


@pytest.fixture
def helpers(monkeypatch) -> remote_stacks._Helpers:
    import ray._private.auto_init_hook as auto_init

    monkeypatch.setattr(auto_init, "enable_auto_connect", False)  # a call of Ray's would start a cluster otherwise
    monkeypatch.setattr(remote_stacks, "HELPERS", remote_stacks._Helpers())
    return remote_stacks.HELPERS


def test_helpers_that_could_not_be_started_with_the_job_are_said_by_the_dump(helpers, monkeypatch):
    helpers.start_on([{"NodeID": NODE, "Alive": True}])  # never raises: the job goes on
    # where the worker noted its node (ray_process, in Ray's KV store: not here without Ray)
    monkeypatch.setattr("ray.experimental.internal_kv._internal_kv_get", lambda key, namespace: NODE.encode())
    said: list[ev.Event] = []
    remote_stacks.take({"rollout/1": ops.Where(4121, "actor-1")}, "d1", "run-1", "", said.append)
    assert [(s.dump_id, s.target) for s in said if isinstance(s, ev.StackEvent)] == [("d1", "rollout/1")]
    error = said[0].error
    assert error.startswith("no stacks helper could be made on its node: RaySystemError"), error
    assert error.endswith("; stacks helpers could not be started with the job (RuntimeError)"), error


def test_a_helper_that_failed_and_could_not_be_killed_is_said_by_the_dump(helpers):
    said: list[ev.Event] = []
    helper = remote_stacks._Helper(handle=object(), ready=None)
    remote_stacks._answer(object(), (NODE, helper, {"rollout/1": 4121, "rollout/2": 4122}), "d2", said.append)
    assert [s.target for s in said if isinstance(s, ev.StackEvent)] == ["rollout/1", "rollout/2"]
    for stack in said:
        assert stack.error.startswith("the stacks helper on its node failed: RaySystemError"), stack.error
        assert stack.error.endswith("; a failed stacks helper could not be killed (RaySystemError)"), stack.error
    assert helpers.trouble("other-node") == ""  # a node's trouble is said for its own stacks alone
