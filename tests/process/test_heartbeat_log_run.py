"""The log keeps a quiet worker's heartbeat every few seconds, every change a rule reads, and the
last one before a silence; a replay reads as the live state did."""

from __future__ import annotations

import time

import msgspec
import pytest
from conftest import wait_until

from gkd_core.runlog.reader import replay
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.reporter import Reporter


class SteadyReporter(Reporter):
    """Reports a steady CPU share: this test's own process (pumping the subscriber) hovers about the
    idle line on a loaded machine, and every crossing is rightly logged, which is not what is
    counted here (the thinning of a quiet worker's beats; crossings: tests/unit)."""

    def _heartbeat(self, cpu: float, rss: int | None = None) -> bytes:
        return super()._heartbeat(50.0, rss)


@pytest.mark.slow
def test_the_logged_run_ends_in_the_live_state_with_a_fraction_of_the_heartbeats(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", "telemetry.heartbeat_s=0.2",
                           "telemetry.heartbeat_log_s=1.0", step_s=0.05)
    sub = RunSubscriber(sup.run)
    sub.connect()
    rep = SteadyReporter("rollout/7", ingest=sup.endpoints["ingest"], heartbeat_s=0.2)
    rep.register("rollout", 7)
    end = time.monotonic() + 4.0
    while time.monotonic() < end:
        sub.pump(0.02)
    rep.close()  # falls silent; the supervisor restates its last beat
    sent = rep.sent
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        sub.pump(0.02)
    with sup.client() as c:
        c.request("stop")
    assert sup.wait_exit() == 143
    lines = (sup.run / "events.jsonl").read_bytes().splitlines()
    wait_until(lambda: sub.pump(0.02) or sub.seq == replay(lines).last_seq, 20, "the subscriber caught up")
    logged = [e for e in map(wire.decode, lines) if type(e) is ev.HeartbeatEvent and e.src == "rollout/7"]
    assert sent >= 18 and len(logged) <= sent // 2, (sent, len(logged))
    seqs = [e.seq for e in map(wire.decode, lines)]
    assert seqs == sorted(set(seqs))  # strictly increasing, the restated beats too
    want = replay(lines)
    assert want.workers["rollout/7"].last_heartbeat == sub.state.workers["rollout/7"].last_heartbeat
    # the same state as live, but for the count of events applied
    assert msgspec.structs.replace(sub.state, applied=0) == msgspec.structs.replace(want, applied=0)
