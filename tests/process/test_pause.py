"""pause and resume, from the command line to the driver and back (a real supervisor, the demo driver, which
holds at a step's end as the trainer's driver does: telemetry/pausing)."""

from __future__ import annotations

import time

from conftest import wait_until

from gkd_tui import cli


def driver_and_step(sup) -> tuple[str, int]:
    with sup.client() as c:
        state = c.request("snapshot")["state"]
    return state["workers"].get("driver", {}).get("phase", ""), state.get("step") or 0


def test_a_paused_driver_holds_at_its_steps_end_until_resumed_and_a_pause_nobody_ends_ends(start_supervisor,
                                                                                         capsys):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    run = str(sup.run)
    wait_until(lambda: driver_and_step(sup)[1] >= 2, 20, "two steps")
    assert cli.main(["pause", run]) == 0
    assert "pause: pauses at the end of the step under way, for 60.0 min at most" in capsys.readouterr().out
    wait_until(lambda: driver_and_step(sup)[0] == "paused", 10, "the driver paused")
    held_at = driver_and_step(sup)[1]
    # held: no step for a second, and what else is asked is still served (a dump of the driver's stack)
    time.sleep(1.0)
    assert driver_and_step(sup) == ("paused", held_at)
    assert cli.main(["dump-stacks", "driver", "--run", run, "--timeout", "10"]) == 0
    assert "hold" in capsys.readouterr().out  # (its stack: waiting in Pause.hold)
    assert cli.main(["resume", run]) == 0
    assert "resume: resumed after" in capsys.readouterr().out
    wait_until(lambda: driver_and_step(sup)[1] > held_at, 10, "a step after the resume")
    assert cli.main(["resume", run]) == 1  # not paused: said, and a failure
    assert "resume failed: the driver is not paused" in capsys.readouterr().out
    # a pause nobody ends ends at its deadline, and says so
    assert cli.main(["pause", run, "--for", "1"]) == 0
    wait_until(lambda: driver_and_step(sup)[0] == "paused", 10, "the driver paused again")
    held_at = driver_and_step(sup)[1]
    wait_until(lambda: driver_and_step(sup)[1] > held_at, 10, "a step after the pause's deadline")
    said = [e["message"] for e in sup.events() if e.get("kind") == "log" and "pause" in e.get("message", "")]
    assert any("ended by itself at its deadline" in m for m in said), said
    actions = [e for e in sup.events() if e.get("kind") == "action" and e.get("op") in ("pause", "resume")]
    assert [(e["op"], e["ok"]) for e in actions if not isinstance(e.get("result"), dict)
            or not e["result"].get("forwarded")] == [
        ("pause", True), ("resume", True), ("resume", False), ("pause", True)]
