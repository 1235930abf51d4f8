"""The stalled async pipeline of tests/ray/test_pipeline_stalls.py with verl's own MessageQueue actor (verl 0.9's
fully async policy: an async actor with ``max_concurrency=20`` over an asyncio.Condition) between the
rollouter and the trainer ranks: each cause named as itself, the same (tests/pipeline_stalls.py)."""

from __future__ import annotations

import pytest
from conftest import needs
from pipeline_stalls import CAUSES, HEALTHY_S, stalled_and_named

# where verl 0.9 is installed: CI's venv of its own for it (.ci/run), with GKD_REQUIRE_VERL=1
needs("verl", "GKD_REQUIRE_VERL", ".venv-verl")
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("cause", list(CAUSES))
@pytest.mark.timeout(HEALTHY_S + 240)
def test_each_cause_of_a_stalled_pipeline_on_verls_message_queue_is_named_as_itself(gkd_home, cause):
    stalled_and_named(cause, "--verl-queue")
