"""The GKD trainer end to end: a real local Ray cluster, real torch models, real faults."""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import pytest
from conftest import wait_until

from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.telemetry import ops

pytestmark = pytest.mark.slow
TRAINER = "gkd_core.trainer.driver"


def run_states(sup):
    return [e for e in sup.events() if e["kind"] == "run"]


def test_hang_demo_names_only_the_straggler_and_a_restart_resumes(start_supervisor):
    sup = start_supervisor("examples/hang_demo.yaml", "trainer.sync_timeout_s=6", "trainer.total_steps=5",
                           "--linger", "120", driver=TRAINER)
    failed = wait_until(lambda: [e for e in run_states(sup) if e["state"] == "failed"], 240, "the hung run to fail")
    syncs = [e for e in sup.events() if e["kind"] == "sync"]
    timed_out = [e for e in syncs if e["state"] == "timed_out"]
    assert len(timed_out) == 1 and timed_out[0]["pending"] == ["rollout/1"] and timed_out[0]["step"] == 3
    started = next(e for e in syncs if e["state"] == "started" and e["sync_id"] == timed_out[0]["sync_id"])
    assert timed_out[0]["ts"] - started["ts"] <= 6 + 2
    assert "rollout/1" in timed_out[0]["error"] and "pid" in timed_out[0]["error"]
    assert failed[0]["exit_code"] == 3
    steps_before = {e["step"] for e in sup.events() if e["kind"] == "metrics"}
    assert steps_before == {1, 2}
    # named by its peer before the deadline, and `r` proposes the change that follows from it
    named = [e for e in sup.events() if e["kind"] == "alert" and e["code"] == "straggler"]
    assert named and named[0]["targets"] == ["rollout/1"] and named[0]["ts"] - started["ts"] < 6

    with sup.client(timeout_s=5) as c:
        dry = c.request("restart", {"shrink": True, "dry_run": True})
        assert [ch[:3] for ch in dry["changes"]] == [["rollout.n_workers", 2, 1]]
        assert "rollout/1" in dry["changes"][0][3]
        c.request("restart", {})
    wait_until(lambda: [e for e in run_states(sup) if e["state"] == "finished"], 240, "the restarted run to finish")
    events = sup.events()
    assert any(e["kind"] == "log" and "resumed from checkpoints/step_000002" in e["message"] for e in events)
    steps = [e["step"] for e in events if e["kind"] == "metrics"]
    assert sorted(set(steps)) == [1, 2, 3, 4, 5] and steps.count(3) == 1  # nothing lost, nothing done twice
    assert all(e["fingerprint_ok"] for e in events if e["kind"] == "sync" and e["state"] == "done")
    # the teacher's counts on both sides at the end (the restarted incarnation's): every request answered
    client = [e for e in events if e["kind"] == "teacher" and e["side"] == "client"][-1]
    server = [e for e in events if e["kind"] == "teacher" and e["side"] == "server"][-1]
    assert client["sent"] == client["completed"] == server["received"] == server["served"] > 0, (client, server)


def test_one_slow_part_of_a_sync_is_named_with_its_usual_time_and_plotted(start_supervisor):
    """rollout/1's load of the weights after step 3 takes 9 s longer: named as that part of that sync, with
    the part's usual time from the syncs before, within the floor and a few seconds; not as a straggler too.
    (Its run is paused after step 1 and resumed, which the trainer's driver does between steps: a run of its
    own for it would cost the suite half a minute.)"""
    sup = start_supervisor("trainer.total_steps=4", "trainer.sync_timeout_s=300",
                           "faults=[{kind: slow_sync_part, target: rollout/1, step: 3, part: load, seconds: 9}]",
                           driver=TRAINER)
    sup.wait_driver(timeout_s=120)
    with sup.client(timeout_s=5) as c:
        c.hand(ops.PauseArgs(for_s=60))
        paused = wait_until(lambda: [e for e in sup.events() if e["kind"] == "phase" and e["src"] == "driver"
                                     and e["phase"] == "paused"], 240, "the driver held at a step's end")
        time.sleep(2.0)
        c.hand(ops.ResumeArgs())
    wait_until(lambda: [e for e in run_states(sup) if e["state"] == "finished"], 300, "the run to finish")
    events = sup.events()
    held_at = paused[0]["step"]
    steps = [e for e in events if e["kind"] == "metrics"]
    after = next(e for e in steps if e["step"] == held_at + 1)
    assert after["ts"] - paused[0]["ts"] >= 2.0 and sorted(e["step"] for e in steps) == [1, 2, 3, 4]
    began = next(e for e in events if e["kind"] == "sync_part" and e["src"] == "rollout/1" and e["step"] == 3
                 and e["part"] == "load" and e["state"] == "began")
    named = [e for e in events if e["kind"] == "alert" and e["code"] == "sync_part_slow" and not e.get("cleared")]
    assert named and named[0]["targets"] == ["rollout/1"], named
    assert re.match(rf"sync {began['sync_id']} \(step 3\): load into the engine \d+ s on rollout/1, usually "
                    r"[\d.]+ m?s \(the median of the last [34] syncs\)$", named[0]["message"]), named[0]["message"]
    assert named[0]["ts"] - began["ts"] <= MIN_S + 3, named[0]["ts"] - began["ts"]
    assert not [e for e in events if e["kind"] == "alert" and e["code"] in ("straggler", "slower_than_usual")
                and "rollout/1" in e["targets"] and not e.get("cleared")]
    # every member said each of its parts of each sync; the slow one took the fault's 9 s and more
    parts = {(e["src"], e["part"]) for e in events if e["kind"] == "sync_part"}
    assert parts == {("student/0", "gather"), ("student/0", "broadcast"), ("student/0", "verify"),
                     *((f"rollout/{r}", p) for r in (0, 1) for p in ("broadcast", "load", "verify"))}, parts
    ended = next(e for e in events if e["kind"] == "sync_part" and e["src"] == "rollout/1" and e["step"] == 3
                 and e["part"] == "load" and e["state"] == "ended")
    assert ended["ts"] - ended["started"] >= 9


def test_a_killed_worker_is_named_within_the_heartbeat_timeout(start_supervisor):
    sup = start_supervisor("trainer.total_steps=6", "trainer.sync_timeout_s=300", "telemetry.stall_s=10",
                           "faults=[{kind: kill_worker, target: rollout/0, step: 2}]", driver=TRAINER)
    wait_until(lambda: [e for e in run_states(sup) if e["state"] == "failed"], 240, "the run to fail")
    events = sup.events()
    last_seen = max(e["ts"] for e in events if e["src"] == "rollout/0")
    named = [e for e in events if e["kind"] == "log" and e["src"] == "driver" and e["level"] == "error"]
    assert named and "rollout/0" in named[0]["message"] and "pid" in named[0]["message"]
    assert named[0]["ts"] - last_seen < 10, "named after the heartbeat timeout"


def test_a_worker_killed_inside_the_sync_is_the_cause_and_its_peer_is_blocked_by_it(start_supervisor):
    """kill -9 of rollout/1 while the student waits in its broadcast: the student's gloo call fails at once
    ("Connection closed by peer") and Ray says the death a moment later. The dead worker is named, in the
    alerts' targets; the student is a victim of it, not a failure of its own."""
    sup = start_supervisor("trainer.total_steps=6", "trainer.sync_timeout_s=300",
                           "faults=[{kind: hang_sync, target: rollout/1, step: 3}]", "--linger", "60", driver=TRAINER)
    wait_until(lambda: [e for e in sup.events() if e["kind"] == "sync" and e["state"] == "progress"
                        and e["pending"] == ["rollout/1"]], 240, "the sync waiting for rollout/1")
    pid = next(e["pid"] for e in sup.events() if e["kind"] == "worker" and e["src"] == "rollout/1")
    t0 = time.time()
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: [e for e in run_states(sup) if e["state"] == "failed"], 60, "the run to fail")
    events = sup.events()
    [failed] = [e for e in events if e["kind"] == "sync" and e["state"] == "failed"]
    assert failed["pending"] == ["rollout/1"] and failed["blocked"] == ["student/0"], failed
    # the student's gloo error or Ray's word of the death, whichever came first: either way the same cause
    assert failed["error"].startswith("rollout/1 (") and re.search(r"student/0 (failed|still) in the same",
                                                                    failed["error"]), failed["error"]
    critical = [e for e in events if e["kind"] == "alert" and e["severity"] == "critical" and not e.get("cleared")]
    assert critical and critical[0]["targets"] == ["rollout/1"] and critical[0]["ts"] - t0 < 5, critical
    assert not [a for a in critical if "student/0" in a["targets"]], critical
    # the cause says what it was doing: its phase, and the broadcast it had not entered (the hang was before it)
    [failed_alert] = [a for a in critical if a["code"] == "driver_failed"]
    assert failed_alert["targets"] == ["rollout/1"]
    entered = {}  # src -> the last collective it entered
    for e in events:
        if e["kind"] == "collectives" and e["groups"]:
            entered[e["src"]] = e["groups"][0].get("entered", 0)
    assert entered["rollout/1"] == entered["student/0"] - 1  # the student in the step-3 broadcast, rollout/1 not
    assert (f"(its last phase sync_weights (step 3); last in broadcast #{entered['rollout/1']} of group "
            "weight_sync)") in failed_alert["message"], failed_alert["message"]
    from gkd_core.runlog.reader import replay

    with open(sup.run / "events.jsonl", "rb") as f:
        state = replay(f)
    assert state.workers["student/0"].blocked_by == "rollout/1"
    assert state.workers["rollout/1"].blocked_by == ""


def collective_alerts(sup, code: str) -> list[dict]:
    return [e for e in sup.events() if e["kind"] == "alert" and e["code"] == code and not e.get("cleared")]


def test_a_rank_that_never_joins_the_broadcast_is_named_with_the_collective_number(start_supervisor):
    """A 4-rank gloo group (the student, three rollouts); rollout/2 never calls the broadcast of step 3."""
    sup = start_supervisor("rollout.n_workers=3", "trainer.total_steps=5", "trainer.sync_timeout_s=120",
                           "faults=[{kind: hang_sync, target: rollout/2, step: 3}]", "--linger", "60", driver=TRAINER)
    alert = wait_until(lambda: collective_alerts(sup, "collective_not_joined"), 240, "rollout/2 named")[0]
    entered = [(e["src"], g) for e in sup.events() if e["kind"] == "collectives" for g in e["groups"]]
    n = max(g.get("entered", 0) for _, g in entered)  # (a default is left out of the event)
    inside = {src: g for src, g in entered if g.get("entered", 0) == n}
    assert sorted(inside) == ["rollout/0", "rollout/1", "student/0"] and all(g["world"] == 4 for g in inside.values())
    assert alert["targets"] == ["rollout/2"], alert
    assert f"rollout/2 has not joined broadcast #{n} of group weight_sync; 3 peer(s) waiting" in alert["message"]
    assert "rollout/2 is in sync_weights" in alert["message"]
    took = alert["ts"] - min(g["entered_at"] for g in inside.values())
    print(f"rollout/2 named {took:.1f} s after the first peer entered broadcast #{n}")
    assert took <= MIN_S + 2, f"named {took:.1f} s after the first peer entered"


def test_a_rank_frozen_inside_the_broadcast_is_said_to_hold_its_peers_there(start_supervisor):
    """All three ranks enter the broadcast of step 3; rollout/1 stops itself (SIGSTOP) inside it."""
    sup = start_supervisor("trainer.total_steps=4", "trainer.sync_timeout_s=120",
                           "faults=[{kind: stop_in_sync, target: rollout/1, step: 3}]", "--linger", "60",
                           driver=TRAINER)
    alert = wait_until(lambda: collective_alerts(sup, "collective_stuck"), 240, "the frozen rank named")[0]
    assert alert["targets"] == ["rollout/1"], alert
    assert "all 3 ranks joined broadcast #" in alert["message"] and "of group weight_sync" in alert["message"]
    assert "rollout/1 sends no heartbeat (frozen inside it)" in alert["message"], alert
    assert not collective_alerts(sup, "collective_not_joined")
    pid = next(e["pid"] for e in sup.events() if e["kind"] == "worker" and e["src"] == "rollout/1")
    os.kill(pid, signal.SIGCONT)  # thawed, it leaves the broadcast and the run goes on
    # the run's end (its supervisor lingers after it, for the alert above to be read)
    [ended] = wait_until(lambda: [e for e in run_states(sup) if e["state"] in ("finished", "failed")], 240,
                         "the thawed run to end")
    assert ended["state"] == "finished", ended
    assert max(e["step"] for e in sup.events() if e["kind"] == "metrics") == 4


def test_a_killed_teacher_is_timed_out_then_training_goes_on(start_supervisor):
    sup = start_supervisor("trainer.total_steps=5", "teacher.request_timeout_s=2", "teacher.max_retries=1",
                           "faults=[{kind: kill_teacher, step: 2, seconds: 8}]", driver=TRAINER)
    assert sup.wait_exit(300) == 0
    events = sup.events()
    client = [e for e in events if e["kind"] == "teacher" and e["side"] == "client"]
    assert max(e.get("timed_out", 0) for e in client) >= 1
    assert any(e["kind"] == "log" and "teacher microbatch" in e["message"] for e in events)
    # killed as the kernel would (SIGKILL, not a kill on purpose), it is named dead by Ray's view of it
    assert [e["targets"] for e in events if e["kind"] == "alert" and e["code"] == "actor_dead"
            and not e.get("cleared")][:1] == [["teacher/0"]]
    assert max(e["step"] for e in events if e["kind"] == "metrics") == 5
    assert run_states(sup)[-1]["state"] == "finished"


HUNG_SYNC_AND_NVML = """
trainer: {sync_timeout_s: 120.0, total_steps: 4, checkpoint_every: 2}
agent: {gpu_interval_s: 0.5}
faults:
- {kind: hang_sync, target: rollout/1, step: 3}
- {kind: hang_nvml, step: 3}
"""


def test_a_hung_sync_its_stack_a_hung_nvml_then_cancel_and_the_run_goes_on(start_supervisor, tmp_path):
    cfg = tmp_path / "hung.yaml"
    cfg.write_text(HUNG_SYNC_AND_NVML)
    sup = start_supervisor(str(cfg), driver=TRAINER)
    wait_until(lambda: [e for e in sup.events() if e["kind"] == "sync" and e["state"] == "progress"
                        and e["pending"] == ["rollout/1"]], 240, "the hung sync, waiting for rollout/1")

    # its stack, through the node agent (py-spy), in the method the seeds name
    t0 = time.time()
    with sup.client(timeout_s=5) as c:
        c.request("dump_stacks", {"targets": ["rollout/1"], "dump_id": "e2e"})
    stack = wait_until(lambda: [e for e in sup.events() if e["kind"] == "stack" and e["dump_id"] == "e2e"], 10,
                       "rollout/1's stack")[0]
    assert stack["ts"] - t0 < 5 and stack["method"] == "py-spy", stack.get("error")
    assert "sync_rollout_weights" in stack["text"] and "(sync_weights" not in stack.get("error", "")
    assert (sup.run / "stacks" / "e2e" / "rollout_1.txt").read_text().startswith(stack["text"][:40])

    # Ray's own view of the same worker, from the driver's state-API watcher
    ray_view = wait_until(lambda: [e for e in sup.events() if e["kind"] == "ray" and e["target"] == "rollout/1"
                                   and e["task"] == "sync_rollout_weights"], 15, "Ray's view of rollout/1")[-1]
    assert ray_view["state"] == "ALIVE" and ray_view["task_started"] <= time.time()

    # the agent's GPU sampler (the test backend) hangs on its third sample: flagged, with an alert
    hung = wait_until(lambda: [e for e in sup.events() if e["kind"] == "gpu" and e.get("nvml_hung_s")], 20,
                      "an nvml_hung_s gpu event")
    assert hung[0]["src"].startswith("agent/")
    wait_until(lambda: [e for e in sup.events() if e["kind"] == "alert" and e["code"] == "gpu_probe_hung"], 10,
               "the gpu_probe_hung alert")

    t0 = time.time()
    with sup.client(timeout_s=5) as c:
        assert c.request("cancel", {"target": "sync", "mode": "cooperative"})["forwarded"]
    assert sup.wait_exit(240) == 0
    events = sup.events()
    cancelled = [e for e in events if e["kind"] == "sync" and e["state"] == "cancelled"]
    assert cancelled and cancelled[0]["ts"] - t0 < 5
    after = [e for e in events if e["kind"] == "sync" and e["state"] == "done" and e["seq"] > cancelled[0]["seq"]]
    assert after and all(e["fingerprint_ok"] for e in after) and after[0]["step"] == 3
    # the driver's answer comes once the sync has ended, with the request's id (the dashboard shows it where c
    # was pressed): cancelled, the group made again, the weights sent anew
    asked = [e for e in events if e["kind"] == "action" and e["op"] == "cancel" and e["src"] != "driver"]
    acts = [e for e in events if e["kind"] == "action" and e["op"] == "cancel" and e["src"] == "driver"]
    assert len(asked) == 1 and acts and acts[0]["ok"] and acts[0]["request"] == asked[0]["request"] != 0, acts
    assert "cancelled with rollout/1" in acts[0]["result"]["outcome"], acts[0]
    assert "the group was made again" in acts[0]["result"]["outcome"], acts[0]
    assert max(e["step"] for e in events if e["kind"] == "metrics") == 4


def test_the_vllm_engine_without_vllm_is_refused_with_a_clear_message(start_supervisor):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    sup = start_supervisor("rollout.engine=vllm", driver=TRAINER)
    assert sup.wait_exit(60) == 2
    failed = run_states(sup)[-1]
    assert failed["state"] == "failed" and any("vLLM is not installed" in line for line in failed["log_tail"])
    alerts = [e for e in sup.events() if e["kind"] == "alert" and e["code"] == "driver_failed"]
    assert alerts and "rollout.engine=torch" in alerts[0]["message"]


def test_an_out_of_memory_worker_is_named_and_r_proposes_the_memory_ladder(start_supervisor):
    sup = start_supervisor("trainer.total_steps=6", "faults=[{kind: oom, target: rollout/1, step: 3}]",
                           "--linger", "60", driver=TRAINER)
    alert = wait_until(lambda: [e for e in sup.events() if e["kind"] == "alert" and e["code"] == "out_of_memory"],
                       240, "the out_of_memory alert")[0]
    assert alert["targets"] == ["rollout/1"] and "micro_batch_size" in alert["hint"]
    with sup.client(timeout_s=5) as c:
        dry = c.request("restart", {"shrink": True, "dry_run": True})
    keys = [ch[0] for ch in dry["changes"]]
    assert keys[0] == "actor.micro_batch_size" and all("out of memory on rollout/1" in ch[3] for ch in dry["changes"])


def test_a_ray_cluster_that_never_answers_is_named_at_our_deadline(start_supervisor):
    """RAY_ADDRESS of a listener that accepts and says nothing: Ray's own timeouts are minutes;
    ``trainer.init_timeout_s`` ends it, with the address, the phase and what to check."""
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen(16)
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        t0 = time.monotonic()
        sup = start_supervisor("trainer.init_timeout_s=4", driver=TRAINER, RAY_ADDRESS=address)
        assert sup.wait_exit(90) == 3
        took = time.monotonic() - t0
    failed = run_states(sup)[-1]
    assert failed["state"] == "failed" and failed["exit_code"] == 3
    said = [e for e in sup.events() if e["kind"] == "log" and e.get("level") == "error"]
    assert said and f"ray.init ({address}) did not return within 4 s" in said[0]["message"]
    assert "RAY_AUTH_TOKEN" in said[0]["message"]
    assert any("ray.init" in line and "within 4 s" in line for line in failed["log_tail"])
    # named at the deadline, measured from where the driver began to wait: 4 s, and the watchdog's tick
    began = next(e["ts"] for e in sup.events() if e["kind"] == "phase" and e["src"] == "driver"
                 and e["phase"] == "init" and address in (e.get("detail") or ""))
    assert 4.0 <= said[0]["ts"] - began <= 5.0, said[0]["ts"] - began
    assert took < 45, took  # the rest: the supervisor and the driver starting (torch, Ray imported)
