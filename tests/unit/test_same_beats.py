"""A relay sends a worker's beat in full only when it says something new (``relay.same_beat``); the rest go
as ``[src, ts]``, and the state they leave is the one the full beats would: alive at their time, the numbers
a rule reads as the last full one said them."""

from __future__ import annotations

from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import CPU_STEP, FULL_BEAT_S, RSS_STEP, HeartbeatBatcher, same_beat

MEM = ev.MemoryBeat("node", 10 << 30, 100 << 30, 90 << 30, 0)


def beat(t: float, src: str = "rollout/0", **kw) -> ev.Beat:
    fields = {"phase": "generate", "elapsed": t, "rss": 1 << 30, "cpu": 60.0, "dropped": 0, "mem": None} | kw
    return ev.Beat(src, 1000.0 + t, fields["phase"], fields["elapsed"], fields["rss"], fields["cpu"],
                   fields["dropped"], fields["mem"])


def test_what_is_new_in_a_beat():
    last = beat(0)
    assert same_beat(last, beat(1, cpu=60.0 + CPU_STEP - 1, rss=(1 << 30) + RSS_STEP - 1), False)
    for new in (beat(1, phase="train"), beat(1, dropped=3), beat(1, cpu=60.0 + CPU_STEP),
                beat(1, rss=(1 << 30) + RSS_STEP), beat(FULL_BEAT_S)):
        assert not same_beat(last, new, False), new
    idle = beat(0, cpu=9.0)
    assert not same_beat(idle, beat(1, cpu=11.0), False)  # across the idle line, however small the step
    with_mem = beat(0, mem=MEM)
    assert not same_beat(with_mem, beat(1, mem=MEM), False)  # nobody in the batch says its scope yet
    assert same_beat(with_mem, beat(1, mem=ev.MemoryBeat("node", 11 << 30, 100 << 30, 89 << 30, 0)), True)
    for mem in (ev.MemoryBeat("node", 10 << 30, 50 << 30, 40 << 30, 0), ev.MemoryBeat("node", 10 << 30, 100 << 30,
                                                                                      90 << 30, 1),
                ev.MemoryBeat("/kubepods/pod1", 10 << 30, 100 << 30, 90 << 30, 0), None):
        assert not same_beat(with_mem, beat(1, mem=mem), True), mem  # a limit, a kill, a scope of its own


def test_a_node_sends_one_full_beat_a_batch_for_its_scope_and_the_rest_as_same():
    b = HeartbeatBatcher("agent/n0", "n0")
    sent = []
    for t in range(7):
        for i in range(4):
            b.add(beat(t, src=f"rollout/{i}", cpu=60.0 + (t % 3), mem=MEM))
        frames = b.take()
        assert frames is not None
        sent.append(wire.decode(frames[1]))
    assert [len(e.beats) for e in sent] == [4, 1, 1, 1, 1, 4, 1]  # all at first, one for the scope, all at 5 s
    assert [len(e.same) for e in sent] == [0, 3, 3, 3, 3, 0, 3]
    assert sent[1].same == [(f"rollout/{i}", 1001.0) for i in (1, 2, 3)]
    assert b.take() is None


def test_the_state_of_same_beats_is_the_state_of_full_ones():
    full, thin = RunState(), RunState()
    b = HeartbeatBatcher("agent/n0", "n0")
    for t in range(12):
        beats = [beat(t, src=f"rollout/{i}", cpu=5.0 if (i == 1 and t >= 6) else 60.0, mem=MEM) for i in range(3)]
        full.apply(ev.HeartbeatsEvent(src="agent/n0", ts=1000.0 + t, beats=beats))
        for x in beats:
            b.add(x)
        frames = b.take()
        assert frames is not None
        thin.apply(wire.decode(frames[1]))
    for src, w in full.workers.items():
        t = thin.workers[src]
        assert (t.last_heartbeat, t.last_seen, t.cpu_low_since) == (w.last_heartbeat, w.last_seen, w.cpu_low_since)
        assert (t.cpu, t.rss, t.dropped, t.mem) == (w.cpu, w.rss, w.dropped, w.mem)
    assert thin.mem_scopes == full.mem_scopes
    assert thin.workers["rollout/1"].cpu_low_since == 1005.0  # idle from the beat before its first idle one
    # a same beat of a worker the state never heard of: alive, its numbers to come with its next full beat
    thin.apply(ev.HeartbeatsEvent(src="agent/n0", ts=1013.0, same=[("rollout/7", 1013.0)]))
    assert thin.workers["rollout/7"].last_heartbeat == 1013.0 and thin.workers["rollout/7"].cpu_low_since is None


def test_a_batch_the_relay_could_not_send_is_followed_by_full_beats():
    """A full beat dropped on the way (the supervisor's queue full) must not be the one later ``same`` beats
    point to: the workers of a lost batch send in full next time."""
    b = HeartbeatBatcher("agent/n0", "n0")
    for t in range(2):
        for i in range(3):
            b.add(beat(t, src=f"rollout/{i}"))
        frames = b.take()
        assert frames is not None
        if t == 0:
            b.lost()  # the first batch, all full, never arrived
    assert len(wire.decode(frames[1]).beats) == 3
    for i in range(3):
        b.add(beat(2, src=f"rollout/{i}"))
    frames = b.take()
    assert frames is not None
    assert [len(wire.decode(frames[1]).beats), len(wire.decode(frames[1]).same)] == [0, 3]
