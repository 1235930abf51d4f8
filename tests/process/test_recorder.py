"""The supervisor's ingest (``Recorder.drain``) over a real ZeroMQ socket: nodes' heartbeat batches that come
in a row are one event to the subscribers, and nothing is reordered around the events between them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from types import SimpleNamespace

import zmq

from gkd_core.runlog.eventlog import EventLog
from gkd_core.runlog.heartbeats import HeartbeatLog
from gkd_core.state import RunState
from gkd_core.supervisor.ingest import COALESCE_S, Ingest
from gkd_core.supervisor.recorder import BEATS_PER_MESSAGE, Recorder
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.events import MAX_EVENT_BYTES


def batch(node: int, t: float) -> list[bytes]:
    beats = [ev.Beat(f"rollout/{node * 4 + i}", t, "generate", 0.0, 1 << 30, 90.0, 0) for i in range(4)]
    return wire.frames(ev.HeartbeatsEvent(src=f"agent/n{node}", node=f"n{node}", ts=t, beats=beats))


@contextlib.contextmanager
def wired(tmp_path) -> Iterator[tuple[zmq.Socket, zmq.Socket, Recorder, RunState, list[tuple[bytes, bytes]]]]:
    """A real PULL socket and a PUSH connected to it, and a Recorder whose publishes are kept as (kind, line):
    (pull, push, recorder, its state, what it published)."""
    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.rcvhwm = push.sndhwm = 0  # (no limit: what a test sends is queued whole)
    pull.bind("inproc://ingest")
    push.connect("inproc://ingest")
    published: list[tuple[bytes, bytes]] = []
    state = RunState()
    rec = Recorder("r", state, EventLog(tmp_path / "events.jsonl"), HeartbeatLog(every_s=10.0, heartbeat_s=1.0),
                   lambda kind, line: published.append((kind, line)))
    try:
        yield pull, push, rec, state, published
    finally:
        rec.close()
        push.close(0)
        pull.close(0)
        ctx.term()


def take_in(tmp_path, messages: list[list[bytes]], done) -> tuple[Recorder, RunState, list[tuple[bytes, bytes]]]:
    """A Recorder draining a real PULL socket that ``messages`` were pushed to, until ``done(published,
    state)`` or 5 s; (the recorder, its state, what it published as (kind, line))."""
    with wired(tmp_path) as (pull, push, rec, state, published):
        for message in messages:
            push.send_multipart(message)
        deadline = time.monotonic() + 5
        while not done(published, state) and time.monotonic() < deadline:
            if pull.poll(100):
                rec.drain(pull)
    return rec, state, published


def test_batches_in_a_row_are_one_event_and_the_order_is_kept(tmp_path):
    t = time.time()
    rec, state, published = take_in(tmp_path, [
        batch(0, t), batch(1, t), batch(2, t), [wire.encode(ev.PhaseEvent(src="rollout/1", phase="train", ts=t + 0.5))],
        batch(0, t + 1), batch(1, t + 1)], lambda published, state: len(published) >= 3)
    sent = [(kind, wire.decode(line)) for kind, line in published]
    assert [kind for kind, _ in sent] == [b"heartbeats", b"phase", b"heartbeats"]
    first, phase, second = (e for _, e in sent)
    assert isinstance(first, ev.HeartbeatsEvent) and isinstance(second, ev.HeartbeatsEvent)
    assert [b.src for b in first.beats] == [f"rollout/{i}" for i in range(12)]  # the three nodes', in order
    assert [b.src for b in second.beats] == [f"rollout/{i}" for i in range(8)]
    assert first.src == "supervisor" and first.node == ""  # of several nodes, as in the log
    assert first.seq < phase.seq < second.seq == rec.seq
    assert state.workers["rollout/1"].phase == "train" and state.workers["rollout/1"].last_heartbeat == t + 1
    assert state.workers["rollout/11"].last_heartbeat == t
    # the log: every first beat kept, in one line of the supervisor's, before the phase (seq order)
    logged = [wire.decode(line) for line in (tmp_path / "events.jsonl").read_bytes().splitlines()]
    assert [type(e) for e in logged] == [ev.HeartbeatsEvent, ev.PhaseEvent]
    assert [b.src for b in logged[0].beats] == [f"rollout/{i}" for i in range(12)]
    assert logged[0].seq < logged[1].seq


def test_a_long_run_of_batches_is_cut_into_events_a_subscriber_takes(tmp_path):
    """However far behind the ingest is, a heartbeats event stays far below MAX_EVENT_BYTES (a subscriber
    drops a larger one, and would resnapshot), and so does each line of the log."""
    t = time.time()
    nodes = 3 * BEATS_PER_MESSAGE // 4 + 5
    rec, state, published = take_in(tmp_path, [batch(node, t) for node in range(nodes)],
                                    lambda published, state: len(state.workers) >= 4 * nodes)
    sizes = [len(wire.decode(line).beats) for _, line in published]
    assert sum(sizes) == 4 * nodes and len(sizes) >= 3 and max(sizes) <= BEATS_PER_MESSAGE, sizes
    assert max(len(line) for _, line in published) < MAX_EVENT_BYTES // 4
    lines = (tmp_path / "events.jsonl").read_bytes().splitlines()
    assert sum(len(wire.decode(line).beats) for line in lines) == 4 * nodes  # each worker's first beat, logged
    assert max(len(line) for line in lines) < MAX_EVENT_BYTES // 2


def test_the_ingest_waits_for_more_after_it_is_emptied_and_what_gathered_is_one_event(tmp_path):
    """At 8,192 batches a second a loop that woke for each paid a publish and the reducer's call for every
    one: after a read that empties the ingest it waits COALESCE_S, and the batches that came meanwhile go to
    the subscribers as one event. A read cut off at INGEST_BATCH does not wait: there is more."""
    with wired(tmp_path) as (pull, push, rec, state, published):
        ingest = Ingest(rec, SimpleNamespace(ingest=pull, ingest_tcp=None))  # (the sockets it reads of Sockets)
        t = time.time()
        push.send_multipart(batch(0, t))
        assert pull.poll(1000)
        ingest.read({pull: zmq.POLLIN})
        assert ingest.emptied and len(published) == 1
        for n in (1, 2, 3):  # three more nodes' batches, as they come while the ingest waits
            push.send_multipart(batch(n, t))
        started = time.monotonic()
        ingest.gather()
        assert time.monotonic() - started >= COALESCE_S
        assert pull.poll(1000)
        ingest.read({pull: zmq.POLLIN})
        assert len(published) == 2 and len(state.workers) == 16  # one read, one event
        assert [b.src for b in wire.decode(published[1][1]).beats] == [f"rollout/{i}" for i in range(4, 16)]
        ingest.emptied = False  # a read cut off at INGEST_BATCH: read on at once
        started = time.monotonic()
        ingest.gather()
        assert time.monotonic() - started < COALESCE_S
