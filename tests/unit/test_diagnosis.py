"""The diagnosis rules on a RunState built from real events: who is late, stuck or slow."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.state import RunState
from gkd_core.supervisor import alerts
from gkd_core.telemetry import events as ev

T0 = 1000.0
PYSPY = """Process 7424: ray::RolloutWorker
Python v3.11.7

Thread 7424 (idle): "MainThread"
    epoll_wait (libc.so.6)
    Worker.main_loop (ray/_private/worker.py:1069)
Thread 7549 (idle): "Dummy-1"
    clock_nanosleep (libc.so.6)
    time_sleep (libpython3.11.so.1.0)
    WorkerBase._hang (gkd_core/trainer/workers.py:{line})
    RolloutWorker.sync_rollout_weights (gkd_core/trainer/workers.py:334)
    actor_method_executor (ray/_private/function_manager.py:689)
"""


def phase(st, src, name, ts, step=None):
    st.apply(ev.PhaseEvent(src=src, phase=name, step=step, started=ts, ts=ts))


def beat(st, src, ts, cpu):
    st.apply(ev.HeartbeatEvent(src=src, ts=ts, cpu=cpu))


def running_sync(hung_cpu=1.0, until=T0 + 30):
    """hang_demo at step 3: rollout/0 returns from the sync in 0.02 s, rollout/1 never does; the
    student (the broadcast's root) and the driver wait for it."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role in (("driver", "driver"), ("student/0", "student"), ("rollout/0", "rollout"),
                      ("rollout/1", "rollout")):
        st.apply(ev.WorkerEvent(src=src, role=role, rank=0, node="node-a", pid=100, ts=T0 - 50))
    for step in (1, 2):  # two healthy syncs before it
        t = T0 - 40 + 10 * step
        for src in ("driver", "student/0", "rollout/0", "rollout/1"):
            phase(st, src, "sync_weights", t, step)
        for src in ("driver", "student/0", "rollout/0", "rollout/1"):
            phase(st, src, "idle", t + 0.03, step)
    for src in ("driver", "student/0", "rollout/0", "rollout/1"):
        phase(st, src, "sync_weights", T0, 3)
    phase(st, "rollout/0", "idle", T0 + 0.02, 3)
    t = T0
    while t < until:
        t += 1.0
        for src in ("driver", "student/0", "rollout/0"):
            beat(st, src, t, 30.0)
        beat(st, "rollout/1", t, hung_cpu)
    return st


def named(st, now, code=None):
    return [(a.code, a.targets, a.severity) for a in diagnosis.diagnose(st, now)
            if code is None or a.code == code]


def test_the_straggler_is_named_by_its_peer_not_by_the_deadline_and_only_it():
    st = running_sync()
    assert named(st, T0 + 4.5, "straggler") == []  # under the 5 s floor
    assert named(st, T0 + 5.5, "straggler") == [("straggler", ["rollout/1"], "warn")]
    assert named(st, T0 + 10.5, "straggler") == [("straggler", ["rollout/1"], "critical")]  # twice the threshold
    everyone = {t for a in diagnosis.diagnose(st, T0 + 10.5) for t in a.targets}
    assert everyone == {"rollout/1"}  # never the student blocked in its broadcast, never the driver
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 6) if a.code == "straggler"]
    assert a.evidence["baseline_s"] == 0.02 and a.evidence["threshold_s"] == 5.0 and a.evidence["by"] == "peers"
    assert "its peer finished in 20 ms" in a.message and "sync_weights (step 3)" in a.message


def test_stuck_needs_no_cpu_and_the_same_stack_twice_busy_is_cpu_and_a_moving_stack():
    st = running_sync()
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 6) if a.code == "straggler"]
    assert a.evidence["verdict"] == "stuck" and "no CPU progress" in a.message
    for i, line in enumerate((117, 118)):  # a waiting loop: the line moves, the calls do not
        st.apply(ev.StackEvent(target="rollout/1", dump_id=f"auto-{i}", method="py-spy", text=PYSPY.format(line=line),
                               ts=T0 + 6 + 3 * i))
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 10) if a.code == "straggler"]
    assert "the same stack twice" in a.message and a.evidence["verdict"] == "stuck"
    assert "`RolloutWorker.sync_rollout_weights` (workers.py:334) → `WorkerBase._hang` (workers.py:118)" in a.message

    busy = running_sync(hung_cpu=97.0)
    busy.apply(ev.StackEvent(target="rollout/1", dump_id="a", text=PYSPY.format(line=117), ts=T0 + 6))
    busy.apply(ev.StackEvent(target="rollout/1", dump_id="b", text=PYSPY.replace("WorkerBase._hang", "matmul")
                             .format(line=1), ts=T0 + 9))
    (a,) = [a for a in diagnosis.diagnose(busy, T0 + 10) if a.code == "straggler"]
    assert a.evidence["verdict"] == "busy" and "busy: 97 % CPU, stack changing" in a.message


def test_a_frozen_worker_says_so_as_soon_as_its_peers_heartbeats_still_arrive():
    st = running_sync(until=T0 + 3)  # every heartbeat stops at T0 + 3: the path, or the supervisor
    assert named(st, T0 + 9, "heartbeat_stale") == []  # not before stall_s (10 s)
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 12) if a.code == "straggler"]
    # every process silent for 9 s: not frozen (that is for stall_s), and not stuck either: nothing is known
    assert a.evidence["verdict"] == "silent" and "no heartbeat for 9 s, nor from any other process" in a.message
    st = running_sync(until=T0 + 30)
    for t in range(31, 40):  # rollout/1 alone goes silent (SIGSTOP): named at FROZEN_S, not at stall_s
        for src in ("driver", "student/0", "rollout/0"):
            beat(st, src, T0 + t, 30.0)
    assert named(st, T0 + 35, "heartbeat_stale") == []
    assert named(st, T0 + 36.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "critical")]


def test_slower_than_its_own_history_and_not_before_half_the_peers_are_done():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for i in range(4):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, ts=T0))
        phase(st, f"rollout/{i}", "generate", T0 + 1, 1)
    phase(st, "rollout/0", "idle", T0 + 1.5, 1)  # one of four done: too few to judge the others
    assert named(st, T0 + 20) == []
    phase(st, "rollout/1", "idle", T0 + 1.6, 1)  # two of the three peers done: the rest are late
    assert sorted(t[1][0] for t in named(st, T0 + 20, "straggler")) == ["rollout/2", "rollout/3"]

    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for step in range(1, 5):
        phase(st, "student/0", "train", T0 + step, step)
        phase(st, "student/0", "idle", T0 + step + 0.3, step)
    phase(st, "student/0", "train", T0 + 10, 5)
    assert named(st, T0 + 14.9) == []
    assert named(st, T0 + 15.1) == [("slower_than_usual", ["student/0"], "warn")]

    # set-up phases are not compared with their own: the driver's ray.init, then its actors (bench_diagnosis
    # found every run's driver named "slower than usual" in its 11-s actors' init after three 1-s ones)
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for i in range(3):
        phase(st, "driver", "init", T0 + 2 * i)
        phase(st, "driver", "idle", T0 + 2 * i + 1)
    phase(st, "driver", "init", T0 + 10)
    assert named(st, T0 + 21) == []


def test_a_healthy_sync_names_nobody_and_a_live_alert_is_resent_on_a_log_scale():
    st = running_sync()
    phase(st, "rollout/1", "idle", T0 + 0.05, 3)
    for src in ("driver", "student/0"):
        phase(st, src, "idle", T0 + 0.06, 3)
    assert named(st, T0 + 30) == []

    st = running_sync(until=T0 + 60)
    sent = []
    for t in range(5, 60):
        for a in alerts.diff(st, alerts.evaluate(st, T0 + t, 10.0)):
            st.apply(a)
            sent.append(t)
    assert 6 <= len(sent) <= 12  # named, critical, then as the time grows by half, not every second


def _with_alerts(st, now):
    for a in alerts.diff(st, alerts.evaluate(st, now, 10.0)):
        st.apply(a)
    return st


def test_out_of_memory_names_the_worker_and_the_plan_is_the_memory_ladder():
    from gkd_core.config import load_config
    from gkd_core.diagnosis.plan import LADDER, apply, restart_plan

    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    st.apply(ev.LogEvent(src="driver", level="error", ts=T0 + 1, message=(
        "rollout/1 (pid 4121 on node-a, GPU 3) failed in generate: OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 20.00 GiB")))
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 2) if a.code == "out_of_memory"]
    assert a.targets == ["rollout/1"] and "in generate" in a.message
    # the hint says the rungs the restart plan takes, in its order (one ladder, not two that drift)
    at = [a.hint.index(key) for key, _, _ in LADDER]
    assert at == sorted(at), a.hint
    cfg = load_config(None)
    plan = restart_plan(_with_alerts(st, T0 + 2), cfg)
    assert [(c.key, c.old, c.new) for c in plan] == [("actor.micro_batch_size", 16, 8),
                                                      ("rollout.max_new_tokens", 16, 8)]
    assert all("out of memory on rollout/1" in c.because and "memory ladder" in c.because for c in plan)
    assert apply(cfg, plan).actor.micro_batch_size == 8
    st.apply(ev.RunEvent(state="running", ts=T0 + 60))  # a new driver: the old OOM is history
    assert not [a for a in diagnosis.diagnose(st, T0 + 61) if a.code == "out_of_memory"]


def test_after_a_sync_straggler_the_plan_drops_that_worker_and_on_gpus_sets_nccl():
    from gkd_core.config import load_config
    from gkd_core.diagnosis.plan import apply, restart_plan

    cfg = load_config(None)
    st = _with_alerts(running_sync(), T0 + 6)
    (c,) = restart_plan(st, cfg)
    assert (c.key, c.old, c.new) == ("rollout.n_workers", 2, 1) and c.because.startswith("straggler rollout/1")
    st.apply(ev.GpuEvent(src="agent/node-a", node="node-a", index=0, util=0.0, ts=T0 + 6))
    keys = {c.key: c for c in restart_plan(st, cfg)}
    assert keys["trainer.env.NCCL_DEBUG"].new == "INFO" and "weight sync" in keys["trainer.env.NCCL_DEBUG"].because
    assert apply(cfg, list(keys.values())).trainer.env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    generic = restart_plan(RunState(), cfg)  # nothing diagnosed: the config's shrink rules
    assert generic and all(c.because.startswith("nothing diagnosed") for c in generic)


def _teacher_run():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for src in ("driver", "teacher/proxy", "teacher/0"):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], ts=T0))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=8, completed=8, ts=T0 + 1))
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=8, served=8, ts=T0 + 1))
    return st


def test_the_teacher_side_that_holds_the_requests_is_named():
    st = _teacher_run()  # the client sends 4 more; the server never sees them: the path between them
    for t in range(2, 9):
        st.apply(ev.TeacherEvent(src="driver", side="client", sent=12, completed=8, in_flight=4, ts=T0 + t))
        st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=8, served=8, ts=T0 + t))
    assert named(st, T0 + 5) == []
    ((code, targets, _),) = named(st, T0 + 8)
    assert code == "teacher_unreached" and targets == ["teacher/proxy"]

    st = _teacher_run()  # the server receives them, its worker serves none: the teacher workers
    for t in range(2, 9):
        st.apply(ev.TeacherEvent(src="driver", side="client", sent=12, completed=8, in_flight=4, ts=T0 + t))
        st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=12, served=8, queue_depth=4, ts=T0 + t))
    ((code, targets, _),) = named(st, T0 + 8)
    assert code == "teacher_not_serving" and targets == ["teacher/0"]
    # the proxy falls silent (frozen, or the relay that carries its events is): its last counts are not
    # the queue now, and its workers are not to blame
    assert not [n for n in named(st, T0 + 14) if n[0] == "teacher_not_serving"]


def test_no_step_for_three_times_the_median_while_everyone_is_alive():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", ts=T0))
    for step in range(1, 11):
        st.apply(ev.MetricsEvent(step=step, ts=T0 + 12 * step))
    last = T0 + 120
    for t in range(0, 80):
        beat(st, "rollout/0", last + t, 30.0)
    assert named(st, last + 30) == []
    ((code, _, severity),) = named(st, last + 40)
    assert code == "no_progress" and severity == "warn"


def test_a_pause_a_person_asked_for_is_no_stall_during_it_nor_just_after_it():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for src in ("driver", "rollout/0"):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], ts=T0))
    for step in range(1, 11):
        st.apply(ev.MetricsEvent(step=step, ts=T0 + 12 * step))
    last = T0 + 120
    phase(st, "driver", "paused", last + 1, 10)  # held at step 10's end for ten minutes
    for t in range(0, 620):
        beat(st, "rollout/0", last + t, 1.0)
        beat(st, "driver", last + t, 1.0)
    assert named(st, last + 600) == []
    phase(st, "driver", "generate", last + 601, 11)  # resumed: the stall is counted from here
    assert named(st, last + 619) == []


def test_a_slow_healthy_teacher_is_not_unreached_and_a_restart_is_not_a_stall():
    st = _teacher_run()
    for t in range(2, 12):  # the server received everything; one answer came back at t=3, the rest are slow
        st.apply(ev.TeacherEvent(src="driver", side="client", sent=12, completed=9 if t >= 3 else 8,
                                 in_flight=3 if t >= 3 else 4, ts=T0 + t))
        st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=12, served=9 if t >= 3 else 8,
                                 ts=T0 + t))
    assert not [a for a in diagnosis.diagnose(st, T0 + 11) if a.code == "teacher_unreached"]

    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", ts=T0))
    for step in range(1, 11):
        st.apply(ev.MetricsEvent(step=step, ts=T0 + 12 * step))
    st.apply(ev.RunEvent(state="running", restart=1, ts=T0 + 300))  # a restart, long after the last step
    for t in range(300, 340):
        beat(st, "rollout/0", T0 + t, 30.0)
    assert named(st, T0 + 320, "no_progress") == []


def test_with_one_rollout_the_sync_root_and_the_driver_are_not_named_with_it():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for src in ("driver", "student/0", "rollout/0"):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], ts=T0))
    for step in (1, 2, 3):
        for src in ("driver", "student/0", "rollout/0"):
            phase(st, src, "sync_weights", T0 + 10 * step, step)
            phase(st, src, "idle", T0 + 10 * step + 0.05, step)
    st.apply(ev.SyncEvent(sync_id=4, state="started", pending=["rollout/0"], ts=T0 + 40))
    for src in ("driver", "student/0", "rollout/0"):
        phase(st, src, "sync_weights", T0 + 40, 4)
        beat(st, src, T0 + 47, 1.0)
    assert named(st, T0 + 47) == [("slower_than_usual", ["rollout/0"], "warn")]


def test_a_late_sighting_makes_no_span_that_ends_before_it_starts():
    st = RunState()
    st.apply(ev.WorkerEvent(src="Actor/0", role="Actor", ts=T0 + 100))  # first seen now
    phase(st, "Actor/0", "work", T0 + 10)  # a call that began before it was seen
    phase(st, "Actor/0", "idle", T0 + 20)
    assert [(s.phase, s.ended - s.started) for s in st.workers["Actor/0"].spans] == [("work", 10.0)]


def test_a_gpu_full_of_memory_at_zero_utilisation_and_unbalanced_gpus():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    st.apply(ev.WorkerEvent(src="rollout/1", role="rollout", pid=4121, ts=T0))
    gib = 1 << 30
    for t in range(0, 130, 2):
        st.apply(ev.GpuEvent(src="agent/a", node="a", index=0, util=95.0, mem_used=40 * gib, mem_total=80 * gib,
                             ts=T0 + t))
        st.apply(ev.GpuEvent(src="agent/a", node="a", index=1, util=0.0, mem_used=78 * gib, mem_total=80 * gib,
                             pids=[4121], ts=T0 + t))
    assert named(st, T0 + 50, "gpu_idle_full") == []  # not before a minute
    ((_, targets, _),) = named(st, T0 + 128, "gpu_idle_full")
    assert targets == ["gpu a/1", "rollout/1"]
    ((_, targets, _),) = named(st, T0 + 128, "gpu_unbalanced")
    assert targets == ["gpu a/1"]
    st.apply(ev.GpuEvent(src="agent/a", node="a", index=1, util=60.0, mem_used=78 * gib, mem_total=80 * gib,
                         ts=T0 + 130))
    assert named(st, T0 + 131, "gpu_idle_full") == []  # it computes again


def test_a_late_generation_says_the_hang_is_before_the_teacher():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=8, completed=8, ts=T0 + 1))
    for i in range(2):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", ts=T0))
        phase(st, f"rollout/{i}", "generate", T0 + 2, 3)
    phase(st, "rollout/0", "idle", T0 + 2.5, 3)
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 9) if a.code == "straggler"]
    assert a.targets == ["rollout/1"] and "the hang is before the teacher" in a.message


def test_stacks_of_a_named_worker_are_asked_for_twice_three_seconds_apart_once_per_naming():
    st = _with_alerts(running_sync(), T0 + 6)
    auto = diagnosis.AutoStacks()
    asked = {m: auto.due(st, 100.0 + m) for m in (0, 1, 2, 3, 4, 7, 8)}
    assert asked == {0: ["rollout/1"], 1: [], 2: [], 3: ["rollout/1"], 4: [], 7: [], 8: []}
    for a in alerts.diff(st, []):  # the finding goes (the sync finished): a later naming asks anew
        st.apply(a)
    assert auto.due(st, 200.0) == []
    _with_alerts(st, T0 + 7)
    assert auto.due(st, 201.0) == ["rollout/1"]


# --- collectives: who has not joined collective #N, or who is stuck inside it -------------------

def group_of_four(entered: dict[str, int], left: dict[str, int | None], at: float = T0, source: str = "gkd",
                  inside_before: float | None = None):
    """The student and three rollouts in `weight_sync`; each member's last entered and left collective (after 8
    healthy ones, each rank inside each for ``inside_before``, when given)."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    members = ["student/0", "rollout/0", "rollout/1", "rollout/2"]
    for rank, src in enumerate(members):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=rank, ts=T0 - 50))
    if inside_before is not None:
        healthy_collectives(st, inside_before, until=at - 1)
    for rank, src in enumerate(members):
        phase(st, src, "sync_weights", at - 1, step=57)
        st.apply(ev.CollectivesEvent(src=src, ts=at, groups=[ev.CollectiveProgress(
            group="weight_sync", rank=rank, world=4, entered=entered[src], op="broadcast", entered_at=at,
            left=left[src], left_at=at, source=source)]))
    return st


def codes(st, now):
    return [(a.code, a.targets, a.severity) for a in diagnosis.diagnose(st, now) if a.code.startswith("collective")]


def test_the_rank_that_has_not_joined_is_named_with_the_collective_number_after_the_straggler_threshold():
    st = group_of_four({"student/0": 57, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57},
                       {"student/0": 56, "rollout/0": 56, "rollout/1": 56, "rollout/2": 56})
    assert codes(st, T0 + 4.9) == []
    [a] = [a for a in diagnosis.diagnose(st, T0 + 12) if a.code == "collective_not_joined"]
    assert a.targets == ["rollout/1"] and a.severity == "critical"
    assert a.message.startswith("rollout/1 has not joined broadcast #57 of group weight_sync; 3 peer(s) waiting "
                                "for 12 s (rollout/1 is in sync_weights)"), a.message
    assert a.evidence["missing"] == ["rollout/1"] and a.evidence["seq"] == 57
    assert codes(st, T0 + 6) == [("collective_not_joined", ["rollout/1"], "warn")]


def healthy_collectives(st, inside_s: float, n: int = 8, until: float = T0 - 1):
    """``n`` collectives of weight_sync before ``until``, each rank inside each for ``inside_s``."""
    for seq in range(56 - n, 56):
        at = until - (56 - seq) * (inside_s + 1)
        for rank, src in enumerate(["student/0", "rollout/0", "rollout/1", "rollout/2"]):
            st.apply(ev.CollectivesEvent(src=src, ts=at + inside_s, groups=[ev.CollectiveProgress(
                group="weight_sync", rank=rank, world=4, entered=seq, op="broadcast", entered_at=at, left=seq,
                left_at=at + inside_s)]))


def test_a_rank_missing_from_a_collective_whose_waits_are_milliseconds_is_critical_at_the_floor():
    """Peers held inside a collective fifty times as long as its ranks usually wait in one are stalled, not slowed:
    critical at the 5 s floor, not at twice it. A group whose waits are seconds keeps the ladder."""
    entered = {"student/0": 57, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57}
    left = {"student/0": 56, "rollout/0": 56, "rollout/1": 56, "rollout/2": 56}
    st = group_of_four(entered, left, inside_before=0.02)
    assert round(sorted(st.collective_inside["weight_sync"])[16], 6) == 0.02  # its ranks' waits in the healthy ones
    [a] = [a for a in diagnosis.diagnose(st, T0 + 5.2) if a.code == "collective_not_joined"]
    assert (a.targets, a.severity) == (["rollout/1"], "critical")
    assert "waiting for 5 s; usually 20 ms inside one (rollout/1 is in sync_weights)" in a.message, a.message

    # the rank it waits for is in a phase slow by design (a checkpoint while the others wait at a barrier): the ladder
    phase(st, "rollout/1", "checkpoint", T0 - 0.5, step=57)
    assert codes(st, T0 + 5.2) == [("collective_not_joined", ["rollout/1"], "warn")]

    slow = group_of_four(entered, left, inside_before=3.0)
    assert codes(slow, T0 + 5.2) == [("collective_not_joined", ["rollout/1"], "warn")]
    assert codes(slow, T0 + 10.1) == [("collective_not_joined", ["rollout/1"], "critical")]


def test_a_restart_takes_the_old_ranks_collectives_with_them():
    """The driver restarted (by a person or the recovery policy): the collective its frozen rank never joined is
    no one's to join now, and the new driver's ranks are not named for it."""
    st = group_of_four({"student/0": 57, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57},
                       {"student/0": 56, "rollout/0": 56, "rollout/1": 56, "rollout/2": 56})
    assert codes(st, T0 + 12) != []
    st.apply(ev.RunEvent(state="restarting", restart=1, ts=T0 + 13))
    st.apply(ev.RunEvent(state="running", restart=1, ts=T0 + 20))
    st.apply(ev.WorkerEvent(src="rollout/1", role="rollout", rank=2, pid=4242, ts=T0 + 25))
    assert codes(st, T0 + 40) == []


def test_a_collective_that_every_rank_left_says_nothing_and_one_rank_unseen_is_counted():
    done = group_of_four(dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], 57),
                         dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], 57))
    assert codes(done, T0 + 60) == []
    st = group_of_four({"student/0": 3, "rollout/0": 3, "rollout/1": 3, "rollout/2": 3},
                       {"student/0": 2, "rollout/0": 2, "rollout/1": 2, "rollout/2": 2})
    for g in st.collectives["weight_sync"].values():
        g.world = 5  # a fifth rank never reported (a process the run does not watch)
    assert codes(st, T0 + 8) == []  # all it knows joined, but one rank it never heard from: no "all joined"


def test_all_joined_and_one_frozen_inside_names_the_frozen_one_else_the_transport():
    st = group_of_four(dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], 9),
                       {"student/0": 9, "rollout/0": 9, "rollout/1": 8, "rollout/2": 9})
    for src in ("student/0", "rollout/0", "rollout/2"):
        beat(st, src, T0 + 7.5, cpu=2.0)
    beat(st, "rollout/1", T0 + 0.5, cpu=2.0)  # its last word: then SIGSTOP
    [a] = [a for a in diagnosis.diagnose(st, T0 + 8) if a.code == "collective_stuck"]
    assert a.targets == ["rollout/1"] and "all 4 ranks joined broadcast #9 of group weight_sync" in a.message
    assert "rollout/1 sends no heartbeat (frozen inside it)" in a.message
    beat(st, "rollout/1", T0 + 7.6, cpu=2.0)  # alive, yet not out: the transport
    [a] = [a for a in diagnosis.diagnose(st, T0 + 8) if a.code == "collective_stuck"]
    assert a.targets == ["rollout/1"] and "stuck in the transport" in a.message and "NCCL" in a.hint


def test_a_gloo_group_read_from_the_flight_recorder_names_the_missing_rank_but_never_says_stuck():
    # gloo's recorder never marks a collective completed: `left` is unknown
    unknown = dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], None)
    st = group_of_four({"student/0": 4, "rollout/0": 4, "rollout/1": 4, "rollout/2": 3}, unknown,
                       source="flight_recorder")
    assert codes(st, T0 + 8) == [("collective_not_joined", ["rollout/2"], "warn")]
    all_in = group_of_four(dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], 4), unknown,
                           source="flight_recorder")
    assert codes(all_in, T0 + 60) == []


def test_a_member_that_leaves_the_group_is_forgotten_and_a_stopped_run_is_not_diagnosed():
    st = group_of_four({"student/0": 57, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57},
                       {"student/0": 56, "rollout/0": 56, "rollout/1": 56, "rollout/2": 56})
    st.apply(ev.CollectivesEvent(src="rollout/1", ts=T0 + 1, groups=[]))
    assert "rollout/1" not in st.collectives["weight_sync"]
    st.apply(ev.RunEvent(state="stopped", ts=T0 + 2))
    assert codes(st, T0 + 30) == []


def test_a_dead_cause_says_its_last_phase_and_the_collective_it_was_inside():
    st = group_of_four({"student/0": 57, "rollout/0": 57, "rollout/1": 57, "rollout/2": 57},
                       {"student/0": 56, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57})
    st.apply(ev.RunEvent(state="failed", exit_code=3, reason="exited with code 3", ts=T0 + 3, log_tail=[
        "gkd driver: rollout/1 (pid 12 on n1, GPU -) died or was cancelled during sync_weights: ActorDiedError: "
        "The actor died unexpectedly; student/0 failed in the same sync_weights because of it (RuntimeError: "
        "Connection closed by peer)"]))
    [a] = [a for a in diagnosis.diagnose(st, T0 + 4) if a.code == "driver_failed"]
    assert a.targets == ["rollout/1"] and a.evidence == {"verdict": "dead"}
    assert a.message.endswith("(its last phase sync_weights (step 57); inside broadcast #57 of group weight_sync)")
    assert len(a.message) <= 300


# --- cascades: the workers a cause holds up are shown as blocked by it, not as faults of their own ----------

def test_the_peers_waiting_in_a_collective_are_blocked_by_the_rank_that_has_not_joined_until_it_clears():
    st = group_of_four({"student/0": 57, "rollout/0": 57, "rollout/1": 56, "rollout/2": 57},
                       {"student/0": 56, "rollout/0": 56, "rollout/1": 56, "rollout/2": 56})
    _with_alerts(st, T0 + 12)
    [a] = [a for a in st.alerts.values() if a.code == "collective_not_joined"]
    assert a.evidence["blocked"] == ["rollout/0", "rollout/2", "student/0"]
    assert {s: w.blocked_by for s, w in st.workers.items()} == {
        "student/0": "rollout/1", "rollout/0": "rollout/1", "rollout/1": "", "rollout/2": "rollout/1"}
    st.apply(ev.CollectivesEvent(src="rollout/1", ts=T0 + 13, groups=[ev.CollectiveProgress(
        group="weight_sync", rank=2, world=4, entered=57, op="broadcast", entered_at=T0 + 13, left=57)]))
    for src, rank in (("student/0", 0), ("rollout/0", 1), ("rollout/2", 3)):
        st.apply(ev.CollectivesEvent(src=src, ts=T0 + 13, groups=[ev.CollectiveProgress(
            group="weight_sync", rank=rank, world=4, entered=57, op="broadcast", entered_at=T0, left=57)]))
    _with_alerts(st, T0 + 14)
    assert not st.alerts and all(not w.blocked_by for w in st.workers.values())


def test_a_rank_dead_inside_a_collective_blocks_the_peers_inside_it_not_those_that_came_out():
    st = group_of_four(dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], 9),
                       {"student/0": 8, "rollout/0": 9, "rollout/1": 8, "rollout/2": 8})
    st.apply(ev.RayEvent(target="rollout/1", ts=T0 + 2, state="DEAD", death_cause="the worker died unexpectedly"))
    _with_alerts(st, T0 + 3)
    [a] = [a for a in st.alerts.values() if a.code == "actor_dead"]
    assert a.targets == ["rollout/1"] and a.evidence["blocked"] == ["rollout/2", "student/0"]
    assert st.workers["rollout/0"].blocked_by == "" and st.workers["student/0"].blocked_by == "rollout/1"


def test_in_a_group_read_from_the_flight_recorder_only_peers_in_a_collective_the_cause_never_entered_wait():
    # gloo's recorder never says what completed: peers at the cause's own collective may be past it
    unknown = dict.fromkeys(["student/0", "rollout/0", "rollout/1", "rollout/2"], None)
    st = group_of_four({"student/0": 5, "rollout/0": 4, "rollout/1": 4, "rollout/2": 4}, unknown,
                       source="flight_recorder")
    st.apply(ev.RayEvent(target="rollout/1", ts=T0 + 2, state="DEAD", death_cause="the worker died unexpectedly"))
    _with_alerts(st, T0 + 3)
    [a] = [a for a in st.alerts.values() if a.code == "actor_dead"]
    assert a.evidence["blocked"] == ["student/0"]


def test_a_teacher_that_dies_blocks_the_driver_waiting_for_its_logprobs():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role in (("driver", "driver"), ("student/0", "student"), ("teacher/0", "teacher")):
        st.apply(ev.WorkerEvent(src=src, role=role, ts=T0 - 50))
    phase(st, "student/0", "idle", T0)
    phase(st, "driver", "teacher_wait", T0, step=4)
    st.apply(ev.RayEvent(target="teacher/0", ts=T0 + 1, state="DEAD", death_cause="the worker died unexpectedly"))
    _with_alerts(st, T0 + 2)
    [a] = [a for a in st.alerts.values() if a.code == "actor_dead"]
    assert a.evidence["blocked"] == ["driver"]
    assert st.workers["driver"].blocked_by == "teacher/0" and st.workers["student/0"].blocked_by == ""
    phase(st, "driver", "train", T0 + 9, step=4)  # a teacher started again: the driver goes on
    assert st.workers["driver"].blocked_by == ""


def test_a_silent_node_agent_is_one_alert_listing_the_workers_it_relays_as_blocked():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    st.apply(ev.WorkerEvent(src="agent/n2", role="agent", node="n2", ts=T0 - 50))
    st.apply(ev.WorkerEvent(src="driver", role="driver", node="n1", ts=T0 - 50))
    for r in range(3):
        st.apply(ev.WorkerEvent(src=f"rollout/{r}", role="rollout", node="n2", via="agent/n2", ts=T0 - 50))
    for src in ("agent/n2", "rollout/0", "rollout/1", "rollout/2"):
        beat(st, src, T0, cpu=50.0)
    beat(st, "driver", T0 + 19.5, cpu=50.0)
    _with_alerts(st, T0 + 20)
    assert [(a.code, a.targets) for a in st.alerts.values()] == [("heartbeat_stale", ["agent/n2"])]
    [a] = st.alerts.values()
    assert a.evidence["blocked"] == ["rollout/0", "rollout/1", "rollout/2"]
    assert [st.workers[f"rollout/{r}"].blocked_by for r in range(3)] == ["agent/n2"] * 3
    for src in ("agent/n2", "rollout/0", "rollout/1", "rollout/2"):  # the agent is back, with their beats
        beat(st, src, T0 + 21, cpu=50.0)
    _with_alerts(st, T0 + 21.5)
    assert not st.alerts and all(not w.blocked_by for w in st.workers.values())


def test_a_rollout_whose_weights_differ_after_a_sync_is_named():
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src in ("student/0", "rollout/0", "rollout/1"):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], ts=T0 - 50))
    st.apply(ev.SyncEvent(src="driver", sync_id=7, state="started", step=6, ts=T0))
    st.apply(ev.SyncEvent(src="driver", sync_id=7, state="done", step=6, ts=T0 + 0.1, fingerprint_ok=False,
                          differ=["rollout/1"], error="rollout weights differ from the student's: rollout/1 has "
                                                      "9f2a (the student's: 41c7)"))
    [a] = [a for a in diagnosis.diagnose(st, T0 + 1) if a.code == "fingerprint_mismatch"]
    assert a.targets == ["rollout/1"] and a.severity == "critical"
    assert a.message.startswith("after sync 7 (step 6) rollout/1: its weights differ from the student's; ")
    # the next sync, a moment later, puts it right: still said (a step ran on stale weights), then gone
    st.apply(ev.SyncEvent(src="driver", sync_id=8, state="started", step=7, ts=T0 + 0.5))
    st.apply(ev.SyncEvent(src="driver", sync_id=8, state="done", step=7, ts=T0 + 0.6, fingerprint_ok=True))
    [a] = [a for a in diagnosis.diagnose(st, T0 + 2) if a.code == "fingerprint_mismatch"]
    assert a.targets == ["rollout/1"] and a.severity == "warn" and "(the syncs since matched)" in a.message
    assert not [a for a in diagnosis.diagnose(st, T0 + 61) if a.code == "fingerprint_mismatch"]


def _restarted_at_t0_plus_50():
    """A run whose driver was restarted at T0 + 1 (every worker beat until then), under load: its new
    rollout/0 (another pid) registers 49 s later and says init_engine; its first heartbeat, batched by its
    node's relay, is not in yet."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role in (("driver", "driver"), ("rollout/0", "rollout"), ("teacher/proxy", "teacher")):
        st.apply(ev.WorkerEvent(src=src, role=role, node="n1", pid=100, ts=T0 - 50))
        phase(st, src, "idle", T0 - 50)
        beat(st, src, T0, cpu=30.0)
    st.apply(ev.RunEvent(state="restarting", restart=1, ts=T0 + 1))
    st.apply(ev.RunEvent(state="running", restart=1, ts=T0 + 3))
    st.apply(ev.WorkerEvent(src="driver", role="driver", node="n1", pid=200, ts=T0 + 4))
    for t in range(4, 51):
        beat(st, "driver", T0 + t, cpu=5.0)
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", node="n1", pid=201, via="agent/n1", ts=T0 + 50))
    phase(st, "rollout/0", "init_engine", T0 + 50)
    st.apply(ev.WorkerEvent(src="teacher/proxy", role="teacher", node="n1", pid=202, via="agent/n1", ts=T0 + 50.2))
    phase(st, "teacher/proxy", "serve", T0 + 50.2)
    return st


def test_a_worker_started_again_is_not_judged_by_the_last_heartbeat_of_the_one_before():
    """The false alarm of issue #38: `gkd-tui restart` on a loaded node named the new workers critical,
    "no heartbeat for 49-52 s": the silence of the processes that the restart ended, not theirs."""
    st = _restarted_at_t0_plus_50()
    assert named(st, T0 + 50.5, "heartbeat_stale") == []
    beat(st, "rollout/0", T0 + 50.1, cpu=90.0)  # its first beat, a moment late
    beat(st, "teacher/proxy", T0 + 50.3, cpu=1.0)
    assert named(st, T0 + 51.5, "heartbeat_stale") == []
    for t in range(51, 58):  # the new processes fall silent themselves: named from their own last word
        beat(st, "driver", T0 + t, cpu=5.0)
    # the proxy serves: a silence of five beats while the driver's arrive is this process, critical at once;
    # rollout/0 is starting (an import may hold the GIL): warned, critical only past its set-up deadline
    assert named(st, T0 + 55, "heartbeat_stale") == []
    assert sorted(named(st, T0 + 56, "heartbeat_stale")) == [("heartbeat_stale", ["rollout/0"], "warn"),
                                                             ("heartbeat_stale", ["teacher/proxy"], "critical")]
    assert sorted(named(st, T0 + 61, "heartbeat_stale")) == [("heartbeat_stale", ["rollout/0"], "warn"),
                                                             ("heartbeat_stale", ["teacher/proxy"], "critical")]


def _starting(deadline=None):
    """rollout/1 in init_engine since T0, its last heartbeat at T0 + 2 (an import holds the GIL); its
    peers and its node's agent beat on."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    st.apply(ev.WorkerEvent(src="agent/n1", role="agent", node="n1", pid=90, ts=T0 - 10))
    phase(st, "agent/n1", "watching", T0 - 10)
    for src in ("driver", "rollout/0", "rollout/1"):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], node="n1", pid=100, via="agent/n1", ts=T0))
    st.apply(ev.PhaseEvent(src="rollout/1", phase="init_engine", started=T0, deadline=deadline, ts=T0))
    beat(st, "rollout/1", T0 + 2, cpu=95.0)
    return st


def _beat_on(st, until):
    for t in range(1, int(until - T0) + 1):
        for src in ("driver", "rollout/0", "agent/n1"):
            beat(st, src, T0 + t, cpu=20.0)


def test_a_starting_worker_is_judged_against_its_set_up_deadline_not_the_heartbeat():
    st = _starting()
    _beat_on(st, T0 + 400)
    assert named(st, T0 + 6.5, "heartbeat_stale") == []
    assert named(st, T0 + 7.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "warn")]  # at FROZEN_S
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 13) if a.code == "heartbeat_stale"]  # past stall_s: still warn
    assert (a.severity, a.targets, a.evidence["verdict"]) == ("warn", ["rollout/1"], "starting")
    assert "in its set-up (phase init_engine" in a.message and "its set-up deadline is in 4.8 min" in a.message
    assert named(st, T0 + 299, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "warn")]
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 301) if a.code == "heartbeat_stale"]  # Settings.setup_s: 300 s
    assert a.severity == "critical" and "past its set-up deadline (5.0 min from the phase's start)" in a.message
    assert "engine init far too long" in a.hint

    st = _starting(deadline=T0 + 60)  # the phase's own deadline wins
    _beat_on(st, T0 + 70)
    assert named(st, T0 + 59, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "warn")]
    assert named(st, T0 + 61, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "critical")]

    st = _starting()  # the same silence outside a set-up phase, its peers heard from: critical at FROZEN_S
    phase(st, "rollout/1", "generate", T0 + 1, step=3)
    _beat_on(st, T0 + 13)
    assert named(st, T0 + 6.5, "heartbeat_stale") == []
    assert named(st, T0 + 7.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "critical")]


def test_a_silence_in_a_phase_slow_on_purpose_or_on_a_busy_node_is_critical_only_at_stall_s():
    st = _starting()
    phase(st, "rollout/1", "checkpoint", T0 + 1)  # a checkpoint's pickling may hold the GIL
    _beat_on(st, T0 + 13)
    assert named(st, T0 + 7.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "warn")]
    assert named(st, T0 + 12.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "critical")]

    st = _starting()
    phase(st, "rollout/1", "generate", T0 + 1, step=3)
    st.apply(ev.PhaseEvent(src="agent/n1", phase="node_busy", started=T0 + 1, detail="node n1: busy", ts=T0 + 1))
    _beat_on(st, T0 + 13)
    assert named(st, T0 + 7.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "warn")]
    assert named(st, T0 + 12.5, "heartbeat_stale") == [("heartbeat_stale", ["rollout/1"], "critical")]


def test_a_silence_on_a_node_its_agent_calls_busy_says_so_and_is_no_death():
    st = _starting()
    _beat_on(st, T0 + 20)
    busy = ("node n1: 2.0 of its 2 cores busy, 1.9 of them held by processes outside this run (pid 7 python (96 %)); "
            "workers here may start slowly and their heartbeats come late")
    st.apply(ev.PhaseEvent(src="agent/n1", phase="node_busy", started=T0 + 5, detail=busy, ts=T0 + 5))
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 20) if a.code == "heartbeat_stale"]
    assert (a.severity, a.evidence["verdict"], a.evidence["node_busy"]) == ("warn", "starved", True)
    assert a.message.endswith(busy) and "on a busy node" in a.hint
    # the agent's phase is no work of its own: no straggler, no slower-than-usual of it
    assert [x for x in diagnosis.diagnose(st, T0 + 20) if "agent/n1" in x.targets] == []
    phase(st, "rollout/1", "generate", T0 + 1, step=3)  # outside set-up: still named critical, the load said with it
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 20) if a.code == "heartbeat_stale"]
    assert a.severity == "critical" and a.message.endswith(busy)


def test_after_a_restart_the_old_drivers_teacher_requests_and_its_set_up_are_no_alarm():
    """Seen on a healthy `gkd-tui restart` with no load: the driver that was stopped had 2 teacher requests in
    flight, and they read as "unreached" until the new driver's client said its own counts; and the moment
    between its join_group and its resume read as 35 s without a step, naming the node agent."""
    st = _teacher_run()
    st.apply(ev.WorkerEvent(src="agent/n1", role="agent", node="n1", ts=T0))
    phase(st, "agent/n1", "watching", T0)
    for step in range(1, 11):
        st.apply(ev.MetricsEvent(step=step, ts=T0 + 0.2 * step))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=54, completed=52, in_flight=2, ts=T0 + 2))
    st.apply(ev.RunEvent(state="restarting", restart=1, ts=T0 + 3))
    st.apply(ev.RunEvent(state="running", restart=1, ts=T0 + 6))
    st.apply(ev.WorkerEvent(src="driver", role="driver", pid=7, ts=T0 + 9))
    for name, t in (("load_data", 9), ("init", 13), ("join_group", 40), ("idle", 40.02), ("resume", 40.05)):
        phase(st, "driver", name, T0 + t)
    st.apply(ev.WorkerEvent(src="agent/n1", role="agent", node="n1", pid=8, ts=T0 + 23))
    phase(st, "agent/n1", "watching", T0 + 23)
    for t in range(9, 45):
        beat(st, "driver", T0 + t, 5.0)
        if t >= 23:
            beat(st, "agent/n1", T0 + t, 1.0)
    assert named(st, T0 + 30) == [] and named(st, T0 + 40.03) == []
    phase(st, "driver", "generate", T0 + 40.1, step=11)
    assert named(st, T0 + 44) == []
    # the new driver's own requests, unanswered with no server to take them, are still named: from when it
    # sent them (its counts start again under the old name: the old driver's moments are not its own)
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=2, completed=0, in_flight=2, ts=T0 + 41))
    assert named(st, T0 + 41.5, "teacher_unreached") == []
    assert named(st, T0 + 47, "teacher_unreached") == [("teacher_unreached", ["teacher/proxy"], "critical")]


def test_a_teacher_proxy_started_again_counts_from_its_own_first_word():
    """A proxy started again reports under the old name with counts from zero: its receipts are of this
    moment, not of the old one's last (which would read as "received nothing since the client sent")."""
    st = _teacher_run()
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=50, served=50, ts=T0 + 1))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=50, completed=50, in_flight=0, ts=T0 + 1))
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=3, served=1, queue_depth=2, ts=T0 + 20))
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=53, completed=51, in_flight=2, ts=T0 + 20.5))
    server = st.teacher.by_src["server:teacher/proxy"]
    assert (server.received_at, server.progress_at) == (T0 + 20, T0 + 20)
    assert named(st, T0 + 21, "teacher_unreached") == []



def test_a_pass_in_turns_reads_the_state_as_each_rule_finds_it_and_finds_what_one_pass_finds():
    """The supervisor takes a pass in turns (``Pass.turn``), its ingest read in between: a pass at 131,072 workers
    after a step's burst of changes is tens of milliseconds, which no event should wait for whole. A turn runs one
    rule at the least and stops once its budget is spent; a rule reads the state as it is when the rule runs, and
    the findings are the same as one pass later."""
    from gkd_core.diagnosis.rules import RULES

    st = running_sync(until=T0 + 30)
    for t in range(31, 40):
        for src in ("driver", "student/0", "rollout/0"):
            beat(st, src, T0 + t, 30.0)
    whole = diagnosis.diagnose(st, T0 + 36.5)
    taken = diagnosis.Pass(st, T0 + 36.5)
    assert taken.turn(0.0) is None and taken.turns == 1  # one rule: heartbeat_stale, which names rollout/1
    beat(st, "rollout/1", T0 + 36.4, 30.0)  # its beat comes back before the next turn
    found = None
    while found is None:
        found = taken.turn(0.0)
    assert taken.turns == len(RULES) and taken.took_s > 0
    assert [a.targets for a in found if a.code == "heartbeat_stale"] == [["rollout/1"]]  # found before it came
    assert [(a.code, a.targets) for a in found] == [(a.code, a.targets) for a in whole]
    assert named(st, T0 + 36.5, "heartbeat_stale") == []  # the next pass reads it
