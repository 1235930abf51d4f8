import json

import msgspec
import pytest

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.answers import Stopping

SAMPLES = [
    ev.RunEvent(state="running", config_digest="abc", restart=1, total_steps=5),
    ev.WorkerEvent(role="rollout", rank=1, node="n0", pid=42, gpus=[0, 1], actor_id="a1"),
    ev.PhaseEvent(phase="sync_weights", step=3, started=1.0, deadline=61.0, detail="x"),
    ev.HeartbeatEvent(phase="train", elapsed=1.5, rss=1 << 20, cpu=12.5, dropped=2),
    ev.HeartbeatEvent(phase="grow", rss=1 << 30,
                      mem=ev.MemoryBeat("/sys/fs/cgroup/job_42", 2 << 30, 3 << 30, 5 << 30, 1)),
    ev.HeartbeatsEvent(node="n0", beats=[ev.Beat("rollout/0", 1.5, "generate", 0.5, 1 << 20, 80.0, 0),
                                         ev.Beat("rollout/1", 1.6, "train"),
                                         ev.Beat("rollout/2", 1.7, "train", mem=ev.MemoryBeat("node", 1, 2))]),
    ev.OomKilledEvent(worker="Grower/0", scope="/sys/fs/cgroup/job_42", kills_before=0, kills_after=1),
    ev.SyncEvent(sync_id=7, state="progress", timeout_s=60, elapsed_s=3.0, pending=["rollout/1"], done=["student/0"]),
    ev.TeacherEvent(side="server", received=10, served=9, queue_depth=1, workers={"teacher/0": 9},
                    latency_ms={"p50": 1.0, "p95": 2.0}),
    ev.GpuEvent(node="n0", index=0, util=50.0, mem_used=10, mem_total=20, temp=60.0, power=100.0, pids=[42]),
    ev.GpuEvent(node="n0", nvml_hung_s=4.2),
    ev.MetricsEvent(step=3, loss=1.0, kl=0.5, agreement=0.4, tokens_per_s=100.0, timing={"train": 0.1}),
    ev.StackEvent(dump_id="d1", target="rollout/1", method="py-spy", text="Thread ..."),
    ev.AlertEvent(severity="critical", code="sync_timed_out", message="m", hint="h", targets=["rollout/1"]),
    ev.LogEvent(level="warn", message="hello"),
    ev.ActionEvent(op="stop", by="me", ok=True, result=Stopping(driver_pid=3)),
    ev.PhaseEvent(phase="train", call=9, started=1.5),
    ev.CollectivesEvent(groups=[ev.CollectiveProgress(group="weight_sync", rank=2, world=4, entered=57, op="broadcast",
                                                      nbytes=4096, entered_at=1.5, left=56, left_at=1.25),
                                ev.CollectiveProgress(group="default_pg", rank=0, world=2, entered=3, left=None,
                                                      source="flight_recorder")]),
    ev.RayPlacementGroupEvent(pg_id="ab" * 18, name="global_pool", state="PENDING", strategy="PACK",
                              bundles=[{"CPU": 10.0}] * 2, scheduling="INFEASIBLE", created=1.25),
    ev.EngineEvent(engine="vllm", running=40, waiting=8, kv_cache=1.0, preemptions=3, generated=1200),
    ev.SendsEvent(to=["MessageQueue/0.put_sample", "Rollouter/0.update_param_version"]),
    ev.FlowEvent(calls={"put_sample": 96, "POST /generate": 97}, queues=[ev.QueueDepth("MessageQueue.samples", 3, 96)]),
    ev.SyncPartEvent(sync_id=57, part="load", state="ended", step=56, started=1.5),
    ev.RayEvent(target="rollout/1", actor_id="a1", state="PENDING_CREATION", task="generate", task_started=1.5,
                required={"GPU": 1.0}),
    ev.RayNodeEvent(node="10.0.0.2", node_id="n" * 56, state="ALIVE", resources={"CPU": 8.0, "GPU": 2.0}),
    ev.GpusEvent(node="n0", readings=[ev.GpuReading(index=0, util=97.0, mem_used=70 << 30, mem_total=80 << 30),
                                      ev.GpuReading(index=3, util=0.0, pids=[4121], proc_mem={"4121": 1 << 30})]),
]


def test_every_kind_of_the_table_is_known():
    assert set(ev.KINDS) == {"run", "worker", "phase", "heartbeat", "heartbeats", "sync", "teacher", "gpu", "gpus",
                             "metrics", "stack", "alert", "log", "action", "ray", "ray_node", "ray_pg", "collectives",
                             "engine", "sync_part", "oom_killed", "sends", "flow"}
    # and each round-trips below as its own type, not as an unknown kind
    assert {type(e) for e in SAMPLES} == set(ev.KNOWN)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_round_trip_keeps_envelope_and_payload(event):
    event.src, event.ts, event.run, event.seq = "rollout/1", 123.5, "r1", 9
    data = wire.encode(event)
    obj = json.loads(data)
    for key in ev.ENVELOPE:
        assert key in obj
    assert obj["v"] == 1 and obj["kind"] == event.__struct_config__.tag
    assert wire.decode(data) == event
    kind, body = wire.frames(event)
    assert kind == obj["kind"].encode() and body == data


def test_unknown_fields_are_tolerated_and_unknown_kinds_kept():
    e = wire.decode(b'{"v":1,"kind":"phase","phase":"train","from_the_future":[1,2]}')
    assert isinstance(e, ev.PhaseEvent) and e.phase == "train"
    u = wire.decode(b'{"v":1,"kind":"profile","seq":4,"src":"x","flame":"..."}')
    assert isinstance(u, ev.UnknownEvent) and u.kind == "profile" and u.fields == {"flame": "..."} and u.seq == 4


@pytest.mark.parametrize("data,reason", [
    (b"\x00\xff garbage", "garbage"),
    (b"", "garbage"),
    (b'["a list"]', "malformed"),
    (b'{"v":1,"kind":"phase"}', "malformed"),  # phase is required
    (b'{"v":1,"kind":"phase","phase":3}', "malformed"),
    (b'{"v":1,"kind":"sync","sync_id":"x","state":"done"}', "malformed"),
    (b'{"v":1,"kind":"heartbeat","ts":"yesterday"}', "malformed"),
    (b'{"v":1,"phase":"x"}', "malformed"),  # no kind
    (b'{"v":2,"kind":"phase","phase":"x"}', "version"),
    (b'{"v":"1","kind":"phase","phase":"x"}', "version"),
    (b'{"v":1,"kind":"log","message":"' + b"x" * (1 << 20) + b'"}', "oversized"),
])
def test_bad_messages_are_rejected_with_a_reason(data, reason):
    with pytest.raises(wire.Rejected) as info:
        wire.decode(data)
    assert info.value.reason == reason
    with pytest.raises(wire.Rejected) as info2:
        wire.decode_dict(data)
    assert info2.value.reason == reason


def test_a_missing_version_reads_as_1():
    assert wire.decode(b'{"kind":"log","message":"m"}').v == 1
    assert wire.decode_dict(b'{"kind":"log","message":"m"}')[0]["v"] == 1


def test_reject_counter_counts_by_reason():
    c = wire.RejectCounter()
    for data in (b"junk", b"junk", b'{"v":9,"kind":"log"}'):
        try:
            wire.decode(data)
        except wire.Rejected as r:
            c.add(r)
    assert c.counts == {"garbage": 2, "version": 1} and c.total == 3


def test_decode_never_raises_anything_but_rejected():
    import random

    rnd = random.Random(0)
    pieces = [b"{", b"}", b'"v":1', b'"kind":"phase"', b",", b'"phase":', b"null", b"1e999", b"[", b"]", b'"\\u0000"']
    for _ in range(3000):
        data = b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 12)))
        try:
            wire.decode(data)
        except wire.Rejected:
            pass


def test_envelope_is_msgspec_json():
    assert msgspec.json.decode(wire.encode(ev.LogEvent(message="é")))["message"] == "é"
