import msgspec

from gkd_core.runlog.reader import replay
from gkd_core.state import RunState, decode_state, encode_state
from gkd_core.state.liveness import ALIVE, ENDED, FROZEN, Limits, judge
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire


def seqd(events):
    for i, e in enumerate(events, 1):
        e.seq = i
        e.ts = e.ts or 1000.0 + i
    return events


def scenario():
    return seqd([
        ev.RunEvent(src="supervisor", state="running", total_steps=10, config_digest="d1", run="r"),
        ev.WorkerEvent(src="student/0", role="student", rank=0, node="n0", pid=10),
        ev.WorkerEvent(src="rollout/0", role="rollout", rank=0, node="n0", pid=11),
        ev.WorkerEvent(src="rollout/1", role="rollout", rank=1, node="n1", pid=12, gpus=[1]),
        ev.PhaseEvent(src="rollout/1", phase="sync_weights", step=3, ts=1010.0),
        ev.HeartbeatEvent(src="rollout/1", phase="sync_weights", elapsed=1.0, rss=5, ts=1011.0),
        ev.HeartbeatEvent(src="rollout/0", phase="idle", ts=1011.0),
        ev.SyncEvent(src="driver", sync_id=3, state="started", timeout_s=60, pending=["rollout/0", "rollout/1"],
                     ts=1010.0),
        ev.SyncEvent(src="driver", sync_id=3, state="progress", timeout_s=60, elapsed_s=5.0, pending=["rollout/1"],
                     done=["rollout/0"], ts=1015.0),
        ev.TeacherEvent(src="driver", side="client", sent=4, completed=3, in_flight=1, latency_ms={"p50": 5.0},
                        ts=1012.0),
        ev.TeacherEvent(src="teacher/proxy", side="server", received=4, served=3, queue_depth=1, ts=1013.0),
        ev.GpuEvent(src="agent/n1", node="n1", index=1, util=0.0, mem_used=70, mem_total=80),
        ev.GpuEvent(src="agent/n0", node="n0", nvml_hung_s=4.0, ts=1012.0),
        ev.MetricsEvent(src="driver", step=2, loss=1.5, kl=0.7, agreement=0.3),
        ev.AlertEvent(src="supervisor", severity="warn", code="a", message="w", targets=["rollout/1"]),
        ev.AlertEvent(src="supervisor", severity="critical", code="b", message="c"),
        ev.StackEvent(src="agent/n1", dump_id="x", target="rollout/1", method="py-spy", text="in sync_rollout"),
        ev.ActionEvent(src="supervisor", op="dump_stacks", by="me"),
    ])


def build():
    st = RunState()
    for e in scenario():
        st.apply(e)
    return st


def test_views_of_a_hung_sync():
    st = build()
    assert st.state == "running" and st.total_steps == 10 and st.step == 3 and st.last_seq == 18
    roles = st.workers_by_role()
    assert [w.src for w in roles["rollout"]] == ["rollout/0", "rollout/1"]
    r1 = st.workers["rollout/1"]
    assert r1.phase == "sync_weights" and r1.node == "n1" and r1.gpus == [1]
    assert st.time_in_phase(r1, 1100.0) == 90.0
    assert st.heartbeat_age(r1, 1100.0) == 89.0
    assert [src for src, w in st.workers.items() if judge(st, w, 1100.0, Limits()).word == FROZEN] == \
        ["rollout/0", "rollout/1"]
    assert {judge(st, w, 1012.0, Limits()).word for w in st.workers.values()} == {ALIVE}
    view = st.sync_view(1045.0)  # 5 s reported at 1015 + 30 s since
    assert view.running and view.pending == ["rollout/1"] and view.elapsed_s == 35.0
    assert abs(view.fraction - 35 / 60) < 1e-9
    tot = st.teacher_totals()
    assert (tot.sent, tot.completed, tot.received, tot.served, tot.queue_depth) == (4, 3, 4, 3, 1)
    assert tot.latency_ms == {"p50": 5.0}
    assert [g.node for g in st.gpu_rows()] == ["n1"] and st.hung_probes(1020.0) == [("n0", "nvml", 12.0)]
    assert [a.code for a in st.active_alerts()] == ["b", "a"]  # critical first
    assert st.recent_metrics()[-1].agreement == 0.3
    assert st.stacks["rollout/1"].text == "in sync_rollout"
    assert st.actions[-1].op == "dump_stacks"


def test_sync_end_archives_and_alert_clears_and_gpu_recovers():
    st = build()
    for e in seqd([ev.SyncEvent(sync_id=3, state="timed_out", timeout_s=60, elapsed_s=60, pending=["rollout/1"]),
                   ev.AlertEvent(code="a", targets=["rollout/1"], cleared=True),
                   ev.GpuEvent(node="n0", index=0, util=10.0)]):
        st.apply(e)
    assert st.sync.state == "timed_out" and not st.sync_view(9999.0).running
    assert st.sync_view(9999.0).elapsed_s == 60
    assert st.sync_history[-1].state == "timed_out"
    assert [a.code for a in st.active_alerts()] == ["b"]
    assert st.hung_probes(9999.0) == [] and len(st.gpus) == 2


def test_run_end_marks_workers_exited_so_they_are_not_stale():
    st = build()
    st.apply(ev.RunEvent(state="failed", exit_code=-9, reason="killed by SIGKILL", ts=2000.0, seq=99))
    assert {judge(st, w, 3000.0, Limits()).word for w in st.workers.values()} == {ENDED}
    assert st.workers["rollout/1"].phase == "exited"


def test_snapshot_round_trip_is_equal_and_continues_identically():
    events = scenario()
    full = RunState()
    for e in events:
        full.apply(e)
    half = RunState()
    for e in events[:9]:
        half.apply(e)
    clone = decode_state(encode_state(half))
    assert clone == half
    for e in events[9:]:
        clone.apply(e)
    assert clone == full


def test_unknown_kinds_are_counted_not_fatal():
    st = RunState()
    st.apply(wire.decode(b'{"v":1,"kind":"future","seq":1,"x":1}'))
    assert st.unknown == {"future": 1} and st.last_seq == 1


def test_replay_skips_bad_lines():
    lines = [wire.encode(e) for e in scenario()]
    lines.insert(3, b"not json")
    assert replay(lines) == build()


def test_histories_are_bounded():
    st = RunState()
    for i in range(2000):
        st.apply(ev.MetricsEvent(step=i, seq=i + 1, ts=float(i)))
        st.apply(ev.SyncEvent(sync_id=i, state="done", seq=i + 1, ts=float(i)))
    assert len(st.metrics) == 512 and len(st.sync_history) == 32
    assert msgspec.json.encode(st)  # still encodable


def test_rays_view_of_a_worker_is_kept_beside_its_own_and_a_dead_actor_raises_an_alert():
    from gkd_core.supervisor import alerts

    st = build()
    st.apply(ev.RayEvent(target="rollout/1", actor_id="a1", state="ALIVE", task="sync_rollout_weights",
                         task_started=1010.0, ts=1012.0))
    w = st.workers["rollout/1"]
    assert (w.ray_state, w.ray_task, w.ray_task_since) == ("ALIVE", "sync_rollout_weights", 1010.0)
    st.apply(ev.RayEvent(target="nobody/9", state="ALIVE", ts=1013.0))
    assert "nobody/9" not in st.workers  # Ray's view never invents a worker
    st.apply(ev.RayEvent(target="rollout/1", actor_id="a1", state="DEAD", death_cause="OOM killed", ts=1014.0))
    dead = [a for a in alerts.evaluate(st, 1015.0, stall_s=1000) if a.code == "actor_dead"]
    assert dead and dead[0].targets == ["rollout/1"] and "OOM killed" in dead[0].message


def test_a_call_that_begins_and_ends_in_the_same_millisecond_is_a_span():
    """Ray's task times are in milliseconds: a peer's sync that took under one is still a finished
    call (without it, the straggler beside it has no peer to be named by)."""
    s = RunState()
    s.apply(ev.WorkerEvent(src="RolloutWorker/0", role="RolloutWorker", ts=100.0))
    for phase, t in (("generate", 10.0), ("idle", 10.2), ("sync_rollout_weights", 12.0), ("idle", 12.0)):
        s.apply(ev.PhaseEvent(src="RolloutWorker/0", phase=phase, started=t, ts=t))
    spans = s.workers["RolloutWorker/0"].spans
    assert [(x.phase, x.started, x.ended) for x in spans][-2:] == [("idle", 10.2, 12.0),
                                                                    ("sync_rollout_weights", 12.0, 12.0)]


def test_a_sync_failed_by_a_death_marks_its_victims_blocked_until_they_start_anew():
    st = build()
    st.apply(ev.PhaseEvent(src="student/0", phase="idle", detail="sync_weights raised RuntimeError", ts=1016.0))
    st.apply(ev.SyncEvent(src="driver", sync_id=3, state="failed", pending=["rollout/1"], ts=1017.0,
                          blocked=["student/0", "rollout/9", "rollout/1"], error="rollout/1 (pid 12) died"))
    assert st.workers["student/0"].blocked_by == "rollout/1"
    assert st.workers["rollout/1"].blocked_by == "" and "rollout/9" not in st.workers  # the cause; a stranger
    st.apply(ev.PhaseEvent(src="student/0", phase="idle", ts=1018.0))
    assert st.workers["student/0"].blocked_by == "rollout/1"  # its own failure's word, after the sync's
    st.apply(ev.PhaseEvent(src="student/0", phase="train", step=4, ts=1030.0))
    assert st.workers["student/0"].blocked_by == ""


def test_what_ray_said_of_an_incarnation_before_is_not_of_the_one_registered_now():
    """The driver starts a teacher again under the same name: Ray's word of the old actor (killed on purpose,
    and seen late) neither marks the new one dead nor raises an alert."""
    from gkd_core.supervisor import alerts

    st = build()
    st.apply(ev.WorkerEvent(src="teacher/0", role="teacher", rank=0, pid=50, actor_id="old", ts=1012.0))
    st.apply(ev.RayEvent(target="teacher/0", actor_id="old", state="DEAD", ts=1013.0,
                         death_cause="The actor is dead because it was killed by `ray.kill`."))
    assert st.workers["teacher/0"].ray_state == "DEAD"
    assert not [a for a in alerts.evaluate(st, 1013.5, stall_s=1000) if a.code == "actor_dead"]  # on purpose
    st.apply(ev.WorkerEvent(src="teacher/0", role="teacher", rank=0, pid=51, actor_id="new", ts=1014.0))
    assert st.workers["teacher/0"].ray_state == ""
    st.apply(ev.RayEvent(target="teacher/0", actor_id="old", state="DEAD", death_cause="late news", ts=1015.0))
    assert st.workers["teacher/0"].ray_state == "" and st.workers["teacher/0"].ray_death_cause == ""
    st.apply(ev.RayEvent(target="teacher/0", actor_id="new", state="ALIVE", ts=1016.0))
    assert st.workers["teacher/0"].ray_state == "ALIVE"


def test_an_engines_counts_land_on_its_worker_survive_a_snapshot_and_read_in_its_details():
    from gkd_tui.screens.worker_details import WorkerDetails

    st = build()
    st.apply(ev.EngineEvent(src="rollout/1", engine="vllm", running=40, waiting=8, kv_cache=1.0, preemptions=3,
                            generated=1200, ts=1019.0, seq=99))
    assert st.workers["rollout/1"].engine.waiting == 8 and st.workers["rollout/0"].engine is None
    assert decode_state(encode_state(st)).workers["rollout/1"].engine == st.workers["rollout/1"].engine
    text = WorkerDetails.describe(st, "rollout/1", 1020.0)
    assert ("engine vllm: 40 running, 8 waiting, KV cache 100 % (full: requests wait for room), 3 preempted, "
            "1200 tokens generated") in text.splitlines()


def test_a_persons_dump_is_still_found_after_the_diagnosis_took_the_same_worker_again():
    """The state keeps a worker's newest stack and the one before: the dashboard's dump of rollout/1 stays
    readable when the diagnosis's own second stack of it lands before the dashboard reads its answer."""
    st = RunState()
    for e in seqd([ev.StackEvent(target="rollout/1", dump_id="d1", method="py-spy", text="in mine"),
                   ev.StackEvent(target="rollout/1", dump_id="auto-7", method="py-spy", text="in theirs")]):
        st.apply(e)
    assert st.stacks["rollout/1"].dump_id == "auto-7"
    assert {t: r.text for t, r in st.dump_records("d1").items()} == {"rollout/1": "in mine"}
    assert set(st.dump_records("auto-7")) == {"rollout/1"} and st.dump_records("d9") == {}
