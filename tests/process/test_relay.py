"""A node's relay: its workers' events through one connection, their heartbeats as one `heartbeats`
message per interval; the supervisor publishes a batch as one event, logs what a replay needs, and a
replay of that log reads as the live state did."""

from __future__ import annotations

import time

import msgspec
import pytest
import zmq
from conftest import wait_until

from gkd_core.runlog.reader import replay
from gkd_core.state import RunState
from gkd_core.state.views import heartbeat_at
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import HeartbeatBatcher, Relay, relay_path
from gkd_core.telemetry.reporter import Reporter
from gkd_tui.sources.replay import ReplaySource


def test_a_batch_leaves_the_state_a_run_of_single_heartbeats_would():
    singles, batched = RunState(), RunState()
    beats = []
    for t in range(6):
        for i in range(3):
            cpu = 2.0 if (i == 1 and t >= 3) else 80.0  # rollout/1 goes idle at 3
            beats.append(ev.Beat(f"rollout/{i}", 100.0 + t + i / 10, "generate", t, (1 << 30) + t, cpu, i))
    for b in beats:
        singles.apply(ev.event_of_beat(b))
    for t in range(6):
        batched.apply(ev.HeartbeatsEvent(src="agent/n0", node="n0", ts=101.0 + t, beats=beats[3 * t:3 * t + 3]))
    for src, w in singles.workers.items():
        assert batched.workers[src] == w
    assert batched.workers["rollout/1"].cpu_low_since == 102.1  # measured from the beat before, as singles do
    # an old beat inside a batch (restated, or late) is nothing new, as for a single one
    batched.apply(ev.HeartbeatsEvent(src="agent/n0", ts=200.0, beats=[beats[0]]))
    assert batched.workers["rollout/0"].last_heartbeat == beats[-3].ts


def test_the_relay_batches_heartbeats_and_forwards_the_rest(tmp_path):
    ctx = zmq.Context()
    up = ctx.socket(zmq.PULL)
    port = up.bind_to_random_port("tcp://127.0.0.1")
    path = relay_path(f"test-{time.monotonic_ns()}", "node-a")
    relay = Relay("agent/node-a", "node-a", f"tcp://127.0.0.1:{port}", path=path, run="r", interval_s=0.3, ctx=ctx)
    address = relay.start()
    assert (path.stat().st_mode & 0o777) == 0o600 and (path.parent.stat().st_mode & 0o777) == 0o700
    reps = [Reporter(f"rollout/{i}", ingest=address, run="r", heartbeat_s=0.1, ctx=ctx) for i in range(4)]
    try:
        for i, rep in enumerate(reps):
            rep.register("rollout", i, via="agent/node-a")
            rep.set_phase("generate", step=1)
        got: list[list[bytes]] = []
        end = time.monotonic() + 1.6
        while time.monotonic() < end:
            if up.poll(50):
                got.append(up.recv_multipart())
    finally:
        for rep in reps:
            rep.close()
        relay.stop()
        up.close(0)
        ctx.term()
    batches = [wire.decode(f[1]) for f in got if f[0] == b"heartbeats"]
    singles = [wire.decode(f[-1]) for f in got if f[0] != b"heartbeats"]
    # about 5 batches in 1.6 s at 0.3 s, each with every worker's beats since the one before
    assert 3 <= len(batches) <= 7, len(batches)
    assert all(b.src == "agent/node-a" and b.node == "node-a" for b in batches)
    assert {x.src for b in batches for x in b.beats} == {f"rollout/{i}" for i in range(4)}
    # none lost: 10 a second per worker, in full or said by the relay's clock when nothing a rule reads changed
    clocks = [c for b in batches for c in b.clocks]
    assert len(clocks) == len(batches) and {w for c in clocks for w in c.joined} == {f"rollout/{i}" for i in range(4)}
    assert not any(c.quiet for c in clocks) and [c.ts for c in clocks] == sorted({c.ts for c in clocks})
    # registrations and phases went through as they came, not a heartbeat among them
    assert {type(e) for e in singles} == {ev.WorkerEvent, ev.PhaseEvent}
    assert len(singles) == 8
    assert not path.exists()  # the relay removes its socket


def test_one_batch_per_node_through_the_supervisor_logged_and_replayed_as_live(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", "telemetry.heartbeat_s=0.2",
                           "telemetry.heartbeat_log_s=1.0", step_s=0.05)
    sub = RunSubscriber(sup.run)
    sub.connect()
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(sup.endpoints["ingest"])
    nodes, per_node = 4, 8
    for i in range(nodes * per_node):
        push.send(wire.encode(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node=f"n{i // per_node}",
                                           via=f"agent/n{i // per_node}", ts=time.time())))
    batchers = [HeartbeatBatcher(f"agent/n{n}", f"n{n}") for n in range(nodes)]
    sent = 0
    clocks_in: list[int] = []  # the relays' clocks of each heartbeats event the subscriber applied (one a batch)

    def pump(timeout_s: float) -> list:
        applied = sub.pump(timeout_s)
        clocks_in.extend(len(e.clocks) for e in applied if type(e) is ev.HeartbeatsEvent)
        return applied

    t0 = time.time()
    while time.time() - t0 < 3.0:
        for n, b in enumerate(batchers):
            for i in range(n * per_node, (n + 1) * per_node):
                idle = i == 5 and time.time() - t0 > 1.5  # one worker goes idle half-way: a change to log
                b.add(ev.Beat(f"rollout/{i}", time.time(), "generate", 0.0, 1 << 30, 1.0 if idle else 90.0, 0))
            push.send_multipart(b.take())
            sent += 1
        pump(0.2)
    push.close(linger=1000)
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        pump(0.05)
    with sup.client() as c:
        c.request("stop")
    assert sup.wait_exit() == 143
    ctx.term()
    lines = (sup.run / "events.jsonl").read_bytes().splitlines()
    events = [wire.decode(line) for line in lines]
    wait_until(lambda: pump(0.02) or sub.seq == replay(lines).last_seq, 20, "the subscriber caught up")
    # every batch reached the subscriber (its relay's clock), in batches taken in a row as one event (one seq each)
    assert sum(clocks_in) >= sent, (sum(clocks_in), sent)
    assert len(clocks_in) <= sent
    logged = [e for e in events if type(e) is ev.HeartbeatsEvent]
    assert logged and all(e.src == "supervisor" for e in logged)
    kept = [b for e in logged for b in e.beats]
    assert len(kept) < sent * per_node // 2, (len(kept), sent * per_node)  # a fraction of the beats
    assert {b.src for b in kept} == {f"rollout/{i}" for i in range(nodes * per_node)}
    assert any(b.src == "rollout/5" and b.cpu < 10 for b in kept)  # the change is kept
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))  # still strictly increasing
    want = replay(lines)
    live = sub.state
    for src in (f"rollout/{i}" for i in range(nodes * per_node)):
        assert heartbeat_at(want, want.workers[src]) == heartbeat_at(live, live.workers[src])
        assert want.workers[src].cpu_low_since == live.workers[src].cpu_low_since
        assert want.workers[src].via == live.workers[src].via == f"agent/n{int(src.split('/')[1]) // per_node}"
    # the dashboard's replay, at the end, the same as live where it matters
    r = ReplaySource(sup.run / "events.jsonl")
    r.to_end()
    for src, w in live.workers.items():
        x = r.state.workers[src]
        assert msgspec.structs.replace(x, last_seen=0.0) == msgspec.structs.replace(w, last_seen=0.0), \
            (src, {f: (getattr(x, f), getattr(w, f)) for f in w.__struct_fields__ if getattr(x, f) != getattr(w, f)})


@pytest.mark.parametrize("relayed", [True, False])
def test_a_silent_relay_is_named_once_and_not_its_workers(relayed):
    from gkd_core.diagnosis.rules import Settings, heartbeat_stale

    st = RunState()
    now = 1000.0
    st.apply(ev.WorkerEvent(src="agent/n1", role="agent", node="n1", pid=9, ts=900.0))
    st.apply(ev.HeartbeatEvent(src="agent/n1", ts=now - 8))
    for i in range(4):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n1", pid=10 + i, ts=900.0,
                                via="agent/n1" if relayed else ""))
        st.apply(ev.HeartbeatEvent(src=f"rollout/{i}", ts=now - 9))
    st.apply(ev.WorkerEvent(src="student/0", role="student", rank=0, node="n0", pid=5, ts=900.0))
    st.apply(ev.HeartbeatEvent(src="student/0", ts=now - 0.5))
    alerts = heartbeat_stale(st, now, Settings(stall_s=10.0, heartbeat_s=1.0))
    if relayed:
        assert [a.targets for a in alerts] == [["agent/n1"]]
        assert "the 4 worker(s) whose events it relays are silent with it" in alerts[0].message
        assert alerts[0].severity == "critical"
    else:
        assert sorted(t for a in alerts for t in a.targets) == ["agent/n1"] + [f"rollout/{i}" for i in range(4)]
