"""A replay from keyframes is the live state at a size that stresses what lies between them: 16,384 workers
on 2,048 nodes through a real supervisor, each node's beats one batch a second from a relay's batcher (the
beats where something moved in full, the relay's clock for the rest; CPU and RSS that move, the node's
memory), merged by the supervisor into events of up to BEATS_PER_MESSAGE beats and logged thinned, a lane
of workers changing phase each second among bursts of progress, and keyframes forked while it streams. At
131,072 workers the replay once was not the live state (#37); this is the check, at a size CI runs in
seconds."""

from __future__ import annotations

import os
import random
import time

import msgspec
import pytest
import zmq
from conftest import RunningSupervisor
from test_keyframes import assert_same

from gkd_core.runlog import keyframes as kf
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import HeartbeatBatcher
from gkd_tui.sources.replay import ReplaySource

NODES, PER_NODE = 2048, 8
WORKERS = NODES * PER_NODE
LANE = 1024  # workers that change phase together each second
PHASES = ("generate", "teacher_wait", "train", "sync_weights")
SECONDS = 8  # of load at least; the idle workers' crossing waits for a keyframe of the load, at most MAX_SECONDS
MAX_SECONDS = 16
IDLE_SECONDS = 4


@pytest.mark.slow
def test_the_replay_from_keyframes_is_the_live_state_at_16384_workers(tmp_path):
    env = dict(os.environ, GKD_HOME=str(tmp_path), GKD_DEMO_STEP_S="60")
    sup = RunningSupervisor(tmp_path, ["trainer.total_steps=100000", "telemetry.keyframe_mb=0.5",
                                       "--driver", "gkd_core.demo_driver"], env)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.sndhwm = 0  # (every message the test makes is sent: the supervisor takes them at its pace)
    push.connect(sup.endpoints["ingest"])
    rnd = random.Random(0)
    try:
        srcs = [f"rollout/{i}" for i in range(WORKERS)]
        for i, src in enumerate(srcs):
            node = f"n{i // PER_NODE}"
            push.send(wire.encode(ev.WorkerEvent(src=src, role="rollout", rank=i, node=node, via=f"agent/{node}",
                                               ts=time.time())))
            push.send(wire.encode(ev.PhaseEvent(src=src, phase="generate", step=0, ts=time.time())))
        batchers = [HeartbeatBatcher(f"agent/n{n}", f"n{n}") for n in range(NODES)]
        phase_of = ["generate"] * WORKERS
        started: list[float] = []  # each second's time
        idle_from = None  # the second the idle workers cross the idle line: after a keyframe of the load
        for second in range(MAX_SECONDS):
            t0 = time.time()
            started.append(t0)
            if idle_from is None and second >= 2 and any(  # (a keyframe that holds a second's beats)
                    kf.read_header(f).max_ts > started[1] for f in kf.frames(sup.run / "keyframes")):
                idle_from = second
            if idle_from is not None and second >= max(SECONDS, idle_from + IDLE_SECONDS):
                break
            lane = range((second % (WORKERS // LANE)) * LANE, (second % (WORKERS // LANE) + 1) * LANE)
            for n, b in enumerate(batchers):
                mem = ev.MemoryBeat("node", (100 << 30) + rnd.randrange(64 << 20), 1 << 40, 900 << 30, 0)
                for i in range(n * PER_NODE, (n + 1) * PER_NODE):
                    idle = i % 97 == 0 and idle_from is not None and second >= idle_from  # changes the log keeps
                    b.add(ev.Beat(srcs[i], time.time(), phase_of[i], float(second), (1 << 30) + rnd.randrange(4 << 20),
                                  2.0 if idle else rnd.uniform(45.0, 55.0), 0, mem))
                push.send_multipart(b.take())
                if n % 2 == 0:  # between the batches: a lane's phase change, then progress within phases
                    k = n // 2
                    i = lane[k] if k < len(lane) else rnd.randrange(WORKERS)
                    if k < len(lane):
                        phase_of[i] = PHASES[(PHASES.index(phase_of[i]) + 1) % len(PHASES)]
                    push.send(wire.encode(ev.PhaseEvent(src=srcs[i], phase=phase_of[i], step=second,
                                                      detail=f"progress {second}.{k}", ts=time.time())))
            time.sleep(max(0.0, 1.0 - (time.time() - t0)))
        assert idle_from is not None, f"no keyframe was written in {MAX_SECONDS} s of load"
        push.send(wire.encode(ev.PhaseEvent(src="marker/0", phase="done", ts=time.time())))  # sent last
        deadline = time.monotonic() + 120
        with sup.client(timeout_s=60.0) as c:
            while True:  # until it has taken in everything sent
                live = msgspec.convert(c.request("snapshot")["state"], RunState)
                marker = live.workers.get("marker/0")
                if marker is not None and marker.phase == "done":
                    break
                assert time.monotonic() < deadline, "the supervisor did not take the load in within 120 s"
                time.sleep(0.5)
            c.request("stop")
        assert sup.wait_exit(60) == 143
    finally:
        push.close(linger=0)
        ctx.term()
        sup.kill()
    log = sup.run / "events.jsonl"
    frames = kf.frames(sup.run / "keyframes")
    assert len(frames) >= 2, "keyframes were written while the load streamed"
    replay = ReplaySource(log)
    replay.seek(live.last_ts)  # the live state's newest event: after it, the run was stopped
    assert replay.base is not None, "the replay starts from a keyframe"
    assert_same(replay.state, live, 1.5)  # every worker's phase, step, spans and heartbeat (to a period), alerts
    moved = [s for s in srcs if live.workers[s].phase != "generate"]
    assert len(moved) >= LANE  # (the lanes did move: the check compares something)
    idle = srcs[::97]
    assert all((replay.state.workers[s].cpu < 10) == (live.workers[s].cpu < 10) for s in idle)
    # and from a keyframe before the idle workers' crossings: they lie, in their relays' batches, between its
    # beats and the ones the log restates at the end (a replay once filled the gap with the older numbers)
    early = ReplaySource(log)
    early.frames = [f for f in early.frames if started[1] < f[0].max_ts < started[idle_from]][-1:]
    early.seek(live.last_ts)
    assert early.base is not None
    assert [s for s in idle if (early.state.workers[s].cpu < 10) != (live.workers[s].cpu < 10)] == []
    assert_same(early.state, live, 1.5)
