import ctypes
import subprocess
import sys
import textwrap
import threading
import time

import zmq

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.reporter import Reporter


def pull_socket():
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.PULL)
    s.linger = 0
    s.bind("tcp://127.0.0.1:*")
    return s, s.last_endpoint.decode()


def collect(sock, seconds):
    out = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            frames = sock.recv_multipart()
            assert len(frames) == 1  # the Reporter sends [json]; the supervisor adds the kind frame
            out.append(wire.decode(frames[0]))
    return out


def test_phases_and_events_arrive_with_envelope():
    sock, addr = pull_socket()
    with Reporter("rollout/1", ingest=addr, run="r1", heartbeat_s=10) as rep:
        rep.register("rollout", 1, gpus=[3])
        with rep.phase("sync_weights", step=4, timeout_s=60):
            rep.log("inside")
        got = collect(sock, 1.0)
    kinds = [(e.kind, getattr(e, "phase", None)) for e in got]
    assert ("worker", None) in kinds
    phases = [e.phase for e in got if e.kind == "phase"]
    assert phases == ["sync_weights", "idle"]
    sync = next(e for e in got if e.kind == "phase")
    assert sync.step == 4 and sync.deadline and sync.deadline > time.time() + 50
    assert all(e.src == "rollout/1" and e.run == "r1" and e.ts > 0 and e.v == 1 for e in got)
    sock.close()


def test_nested_phases_return_to_the_enclosing_one_and_errors_are_noted():
    sock, addr = pull_socket()
    rep = Reporter("student/0", ingest=addr, heartbeat_s=10)
    with rep.phase("train", step=1):
        try:
            with rep.phase("checkpoint"):
                raise OSError("disk full")
        except OSError:
            pass
    rep.close()
    phases = [(e.phase, e.detail) for e in collect(sock, 1.0) if e.kind == "phase"]
    assert [p for p, _ in phases] == ["train", "checkpoint", "train", "idle"]
    assert "disk full" in phases[2][1]
    sock.close()


def test_heartbeats_flow_while_the_main_thread_is_blocked_in_c():
    sock, addr = pull_socket()
    rep = Reporter("rollout/0", ingest=addr, heartbeat_s=0.2)
    with rep.phase("sync_weights"):
        libc = ctypes.CDLL(None)
        t0 = time.monotonic()
        libc.sleep(2)  # a C call, like an NCCL wait: ctypes releases the GIL
        assert time.monotonic() - t0 >= 1.9
    rep.close()
    beats = [e for e in collect(sock, 0.5) if e.kind == "heartbeat" and e.phase == "sync_weights"]
    assert len(beats) >= 7, len(beats)
    assert beats[-1].elapsed > 1.5 and beats[-1].rss > 0
    sock.close()


def test_emit_never_blocks_and_counts_drops_when_the_supervisor_is_away():
    # nothing listens at this address: the socket queues up to its high-water mark, then drops
    rep = Reporter("rollout/9", ingest="tcp://127.0.0.1:9", heartbeat_s=0.1, sndhwm=100, queue_max=1000)
    t0 = time.perf_counter()
    for i in range(20_000):
        rep.emit(ev.LogEvent(message=f"m{i}"))
    took = time.perf_counter() - t0
    time.sleep(0.5)
    rep.close(timeout_s=0.2)
    assert took < 5.0  # never waits on the network (a blocking send would hang forever here)
    assert rep.dropped >= 20_000 - 1000 - 100
    assert rep.sent <= 200


def test_dropped_count_rides_on_heartbeats():
    sock, addr = pull_socket()
    rep = Reporter("rollout/2", ingest=addr, heartbeat_s=0.1, queue_max=10)
    stop = threading.Event()
    blocker = threading.Thread(target=lambda: stop.wait(), daemon=True)
    blocker.start()
    for _ in range(5000):  # far more than the queue holds between two wakeups
        rep.emit(ev.LogEvent(message="x" * 100))
    time.sleep(0.4)
    rep.close()
    stop.set()
    beats = [e for e in collect(sock, 0.5) if e.kind == "heartbeat"]
    assert rep.dropped > 0 and beats and beats[-1].dropped == rep.dropped
    sock.close()


def test_a_reporter_in_a_process_killed_mid_emit_leaves_the_receiver_intact():
    sock, addr = pull_socket()
    code = textwrap.dedent(f"""
        from gkd_core.telemetry.reporter import Reporter
        from gkd_core.telemetry import events as ev
        rep = Reporter("rollout/3", ingest={addr!r}, heartbeat_s=0.05)
        while True:
            rep.emit(ev.LogEvent(message="spam"))
    """)
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        got = collect(sock, 1.5)
    finally:
        p.kill()  # always: a spinning sender left behind would eat a core
        p.wait()
    assert any(e.kind == "heartbeat" for e in got) and any(e.kind == "log" for e in got)
    sock.close()


def test_what_was_queued_before_close_arrives_even_when_the_process_then_exits_at_once():
    """``close`` then ``os._exit`` (the driver's ``give_up``, an injected worker death): a socket's
    close returns before ZeroMQ's I/O thread has sent what it holds, so the reporter waits for it
    (up to the close deadline) — the last words of a dying process are the ones that matter."""
    sock, addr = pull_socket()
    code = textwrap.dedent(f"""
        import os
        from gkd_core.telemetry.reporter import Reporter
        from gkd_core.telemetry import events as ev
        rep = Reporter("driver", ingest={addr!r}, heartbeat_s=10, queue_max=20000, sndhwm=20000)
        for i in range(10000):
            rep.emit(ev.LogEvent(message="%d " % i + "x" * 2000))
        rep.log("last words", level="error")
        rep.close(10.0)
        os._exit(3)
    """)
    p = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(2.0)  # more than the kernel's socket buffers hold waits in ZeroMQ's queue meanwhile
        got = [e for e in collect(sock, 8.0) if e.kind == "log"]
    finally:
        p.kill()
        p.wait()
    assert len(got) == 10001 and got[-1].message == "last words", len(got)
    sock.close()


def test_a_collective_entered_is_said_at_once_and_its_leaving_with_the_next_event():
    import gkd_core.telemetry.collectives as collectives
    from gkd_core.telemetry.collectives import Tracker

    sock, addr = pull_socket()
    tracker, saved = Tracker(), collectives.TRACKER
    collectives.TRACKER = tracker  # this test's own book: the process's is the trainer's
    try:
        with Reporter("rollout/1", ingest=addr, run="r1", heartbeat_s=10) as rep:
            tracker.joined("weight_sync", 1, 4)
            seq = tracker.enter("weight_sync", "broadcast", 4096)
            got = [e for e in collect(sock, 1.0) if e.kind == "collectives"]
            assert got, "nothing said within 1 s of entering (the heartbeat is 10 s away)"
            last = got[-1].groups
            assert [(g.group, g.rank, g.world, g.entered, g.op, g.nbytes, g.left) for g in last] == [
                ("weight_sync", 1, 4, 1, "broadcast", 4096, 0)]
            rep._collectives()  # a beat with nothing new: nothing sent
            assert not [e for e in collect(sock, 0.3) if e.kind == "collectives"]
            tracker.leave("weight_sync", seq)  # leaving wakes nobody: it goes with the next thing sent
            rep.log("the next thing")
            got = [e for e in collect(sock, 1.0) if e.kind == "collectives"]
            assert got and got[-1].groups[0].left == 1 and got[-1].groups[0].left_at >= last[0].entered_at
    finally:
        collectives.TRACKER = saved


def test_collectives_switched_off_record_nothing():
    from gkd_core.telemetry.collectives import Tracker, tracking

    off = Tracker(on=tracking({"GKD_COLLECTIVES": "0"}))
    off.joined("weight_sync", 1, 4)
    assert off.enter("weight_sync", "broadcast", 4096) == 0 and off.snapshot() == [] and off.version == 0
    assert tracking({}) and tracking({"GKD_COLLECTIVES": "1"})


def test_flush_returns_once_the_queue_and_the_collectives_have_gone_to_the_socket():
    """A process about to stop itself (the `stop_in_sync` fault) flushes first: its word that it entered
    the broadcast must leave, or the run calls it a rank that never joined."""
    import gkd_core.telemetry.collectives as collectives
    from gkd_core.telemetry.collectives import Tracker

    sock, addr = pull_socket()
    tracker, saved = Tracker(), collectives.TRACKER
    collectives.TRACKER = tracker
    try:
        rep = Reporter("rollout/1", ingest=addr, run="r1", heartbeat_s=10, queue_max=20000, sndhwm=20000)
        tracker.joined("weight_sync", 1, 3)
        for i in range(5000):
            rep.emit(ev.LogEvent(message=f"{i} " + "x" * 500))
        tracker.enter("weight_sync", "broadcast", 4096)
        assert rep.flush(10.0)
        assert not rep._queue and rep.sent >= 5001 and rep._tracker_seen == tracker.version
        got = collect(sock, 2.0)
        rep.close()
        assert len([e for e in got if e.kind == "log"]) == 5000
        assert [g.entered for g in [e for e in got if e.kind == "collectives"][-1].groups] == [1]
    finally:
        collectives.TRACKER = saved
        sock.close()
