"""A rollout worker replaced in place (#56: the recovery without restarting the run), on the trainer with
``trainer.replace_rollouts``: one killed while it generates is started again by its driver at once; one frozen
inside the weight sync's broadcast is stopped by the recovery (its registration says its driver replaces it), and
started again the same way, the group made anew and the sync done again. The run trains every step once, with
one driver, and ends."""

from __future__ import annotations

import pytest
from conftest import wait_until

TRAINER = "gkd_core.trainer.driver"
STEPS = 8


@pytest.mark.timeout(420)
def test_a_killed_rollout_and_one_frozen_in_the_sync_are_replaced_in_place_and_the_run_goes_on(start_supervisor):
    sup = start_supervisor(
        f"trainer.total_steps={STEPS}", "trainer.replace_rollouts=true", "trainer.eval_every=0",
        "trainer.sync_timeout_s=300", "telemetry.stall_s=5",
        "faults=[{kind: kill_worker, target: rollout/0, step: 2}, {kind: stop_in_sync, target: rollout/1, step: 4}]",
        "--restart-on", "heartbeat_stale,collective_not_joined,collective_stuck,sync_timed_out",
        "--restart-grace", "2", "--linger", "0", driver=TRAINER)
    wait_until(lambda: [e for e in sup.events() if e["kind"] == "run" and e["state"] in ("finished", "failed")],
               360, "the run to end")
    events = sup.events()
    ran = [(e["state"], e.get("restart", 0)) for e in events if e["kind"] == "run"]
    assert ran[-1] == ("finished", 0) and ("restarting", 0) not in ran, ran  # one driver, to the end
    steps = [e["step"] for e in events if e["kind"] == "metrics"]
    assert steps == list(range(1, STEPS + 1)), steps  # every step once: none lost, none trained twice

    # each replaced by its driver: said at once, cleared once the new one was up, a new process under its name
    said = [(e["targets"], bool(e.get("cleared"))) for e in events if e["kind"] == "alert"
            and e["code"] == "restarted_by_driver"]
    assert said == [(["rollout/0"], False), (["rollout/0"], True), (["rollout/1"], False), (["rollout/1"], True)], said
    for src in ("rollout/0", "rollout/1"):
        pids = [e["pid"] for e in events if e["kind"] == "worker" and e["src"] == src]
        assert len(set(pids)) == 2, (src, pids)
        assert all(e["replaceable"] for e in events if e["kind"] == "worker" and e["src"] == src)

    # the frozen one: stopped by the recovery (its report first), not the run restarted
    recovers = [(e["result"]["stage"], e["ok"], e["result"].get("targets")) for e in events
                if e["kind"] == "action" and e["op"] == "recover" and e["result"]["stage"] != "report_written"]
    assert recovers == [("report", True, ["rollout/1"]), ("replace", True, ["rollout/1"])], recovers
    stopped = [e for e in events if e["kind"] == "action" and e["op"] == "cancel" and e["src"] == "driver"]
    assert [(e["ok"], e["result"]["outcome"]) for e in stopped] == [(True, "killed")], stopped
    assert stopped[0]["by"].startswith("the recovery policy: ")
    # the sync it froze in failed on its death and was done again, with the new one, to a matching fingerprint
    syncs = [(e["state"], e.get("fingerprint_ok")) for e in events if e["kind"] == "sync" and e.get("step") == 4
             and e["state"] not in ("started", "progress")]
    assert syncs[0][0] == "failed" and syncs[-1] == ("done", True), syncs

    # and nothing critical stands at the end
    critical = {}
    for e in events:
        if e["kind"] == "alert" and e.get("severity") == "critical":
            key = (e["code"], tuple(e.get("targets") or ()))
            critical.pop(key, None) if e.get("cleared") else critical.__setitem__(key, e["message"])
    assert critical == {}, critical
