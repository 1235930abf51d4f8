"""A relay sends a worker's beat in full only when it says something new (``relay.same_beat``); the others
are a sign of life that its clock says for all its workers at once (``RelayClock``). The state they leave
is the one the full beats would, to within a period: each worker alive at its relay's clock, the numbers a
rule reads as its last full beat said them; a worker that stops is said quiet with its newest beat's time."""

from __future__ import annotations

import msgspec
import pytest

from gkd_core.diagnosis.rules import memory as memory_rules
from gkd_core.runlog.heartbeats import SILENT_BEATS, HeartbeatLog
from gkd_core.state import RunState
from gkd_core.state.views import heartbeat_at, vouch_s
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import (
    CPU_STEP,
    FULL_BEAT_S,
    MEM_STEP,
    MEM_TIGHT,
    QUIET_BEATS,
    RSS_STEP,
    HeartbeatBatcher,
    same_beat,
    same_memory,
)

MEM = ev.MemoryBeat("node", 10 << 30, 100 << 30, 90 << 30, 0)
T0 = 1000.0


def beat(t: float, src: str = "rollout/0", **kw) -> ev.Beat:
    fields = {"phase": "generate", "elapsed": t, "rss": 1 << 30, "cpu": 60.0, "dropped": 0, "mem": None} | kw
    return ev.Beat(src, T0 + t, fields["phase"], fields["elapsed"], fields["rss"], fields["cpu"],
                   fields["dropped"], fields["mem"])


def taken(b: HeartbeatBatcher, t: float) -> ev.HeartbeatsEvent | None:
    frames = b.take(now=T0 + t)
    return None if frames is None else wire.decode(frames[1])  # type: ignore[return-value]


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


def test_a_node_sends_its_clock_and_only_the_beats_that_say_something():
    b = HeartbeatBatcher("agent/n0", "n0")
    sent = []
    full_every = int(FULL_BEAT_S)
    for t in range(full_every + 2):
        for i in range(4):  # each worker beats a little later in the second than the one before
            b.add(beat(t + i / 10, src=f"rollout/{i}", cpu=60.0 + (t % 3), mem=MEM))
        e = taken(b, t + 0.5)
        assert e is not None
        sent.append(e)
    # all at first, then none (the scope's reading as it was said), and all again at FULL_BEAT_S
    assert [len(e.beats) for e in sent] == [4] + [0] * (full_every - 1) + [4, 0]
    [clock] = sent[1].clocks
    assert (clock.relay, clock.epoch, clock.ts) == ("agent/n0", b.epoch, T0 + 1.0)  # the oldest of their newest
    assert sent[0].clocks[0].joined == tuple(f"rollout/{i}" for i in range(4)) and not clock.joined and not clock.quiet
    assert taken(b, full_every + 1.6) is None  # nothing new: not a beat, not a change of the clock


def test_a_scope_s_reading_is_sent_when_it_moves_by_a_share_of_what_is_left_of_it():
    left = MEM.limit - MEM.used  # (90 GB: the node's available memory is as much)
    step = left // MEM_STEP
    within = step - (1 << 20)
    assert same_memory(MEM, ev.MemoryBeat("node", MEM.used + within, MEM.limit, MEM.available - within, 0))
    for moved in (ev.MemoryBeat("node", MEM.used + step, MEM.limit, MEM.available, 0),  # its use
                  ev.MemoryBeat("node", MEM.used, MEM.limit, MEM.available - step, 0),  # the node's available memory
                  ev.MemoryBeat("node", MEM.used, MEM.limit, MEM.available, 1),  # a kill
                  ev.MemoryBeat("node", MEM.used, MEM.limit + 1, MEM.available, 0),
                  ev.MemoryBeat("/kubepods/pod1", MEM.used, MEM.limit, MEM.available, 0)):
        assert not same_memory(MEM, moved), moved
    # near its limit, every reading is new: a node low on memory, a scope nearly full, one with no limit known
    tight = ev.MemoryBeat("node", int(MEM.limit * (1 - MEM_TIGHT)) + 1, MEM.limit, MEM.available, 0)
    assert not same_memory(tight, tight)
    low = ev.MemoryBeat("/slurm/job_7", MEM.used, MEM.limit, int(MEM_TIGHT * MEM.limit) - 1, 0)
    assert not same_memory(low, low)
    # a cgroup of 8 GB on a node of 1 TB: the node's memory moving with other jobs, by a gigabyte, is nothing to it;
    # by a 64th of what the node has left, it is new
    job, node_left = ev.MemoryBeat("/slurm/job_7", 2 << 30, 8 << 30, 800 << 30, 0), 800 << 30
    assert same_memory(job, ev.MemoryBeat(job.scope, job.used, job.limit, node_left - (1 << 30), 0))
    assert not same_memory(job, ev.MemoryBeat(job.scope, job.used, job.limit, node_left - node_left // MEM_STEP, 0))
    assert not same_memory(job, ev.MemoryBeat(job.scope, job.used + (6 << 30) // MEM_STEP, job.limit, node_left, 0))
    assert not same_memory(ev.MemoryBeat("node", 1, 0), ev.MemoryBeat("node", 1, 0))


def test_the_deadband_leaves_the_memory_rules_every_reading_where_they_judge():
    """Where node_memory_low and memory_growing's critical share judge, every reading is sent; a scope warned of
    (its limit within WARN_WITHIN_S at its growth) moves past the deadband more often than its reading goes stale."""
    assert memory_rules.NODE_WARN < MEM_TIGHT and 1 - memory_rules.CRITICAL_FULL < MEM_TIGHT
    assert memory_rules.WARN_WITHIN_S / MEM_STEP < memory_rules.FRESH_S


def test_a_node_sends_its_memory_when_it_moves_past_the_deadband_and_every_beat_near_its_limit():
    b = HeartbeatBatcher("agent/n0", "n0")
    step = (MEM.limit - MEM.used) // MEM_STEP
    used = [MEM.used, MEM.used + step // 2, MEM.used + step // 2 + step // 4,  # noise, within the deadband
            MEM.used + step + 1,  # past it, from the last said
            int(MEM.limit * (1 - MEM_TIGHT)) + 1, int(MEM.limit * (1 - MEM_TIGHT)) + 2]  # near the limit: each one
    said = []
    for t, u in enumerate(used):
        mem = ev.MemoryBeat("node", u, MEM.limit, MEM.limit - u, 0)
        for i in range(4):
            b.add(beat(t + i / 10, src=f"rollout/{i}", mem=mem))
        e = taken(b, t + 0.5)
        assert e is not None
        said.append([x.mem.used for x in e.beats])
    assert said == [[used[0]] * 4, [], [], [used[3]], [used[4]], [used[5]]]  # one beat says the scope's reading


def test_a_worker_that_stops_is_said_quiet_with_its_newest_beat_and_joins_again_in_full():
    b = HeartbeatBatcher("agent/n0", "n0", heartbeat_s=1.0)
    for t in range(3):
        b.add(beat(t, src="rollout/0"))
        b.add(beat(t + 0.2, src="rollout/1"))
        taken(b, t + 0.5)
    # rollout/1 stops after its beat at 2.2; rollout/0 goes on
    for t in range(3, 6):
        b.add(beat(t, src="rollout/0"))
        e = taken(b, t + 0.5)
        if t + 0.5 - 2.2 <= QUIET_BEATS:  # its newest still holds the clock back (sent once: then nothing new)
            assert e is None if t > 3 else (not e.clocks[0].quiet and e.clocks[0].ts == T0 + 2.2), e
        else:
            assert e is not None and e.clocks[0].quiet == (("rollout/1", T0 + 2.2),) and e.clocks[0].ts == T0 + t
            break
    b.add(beat(6.3, src="rollout/1"))
    b.add(beat(6, src="rollout/0"))
    e = taken(b, 6.5)
    assert e is not None and [x.src for x in e.beats] == ["rollout/1"] and e.clocks[0].joined == ("rollout/1",)


@pytest.mark.parametrize("idle_from", [3, 6])  # between two full beats, and just after one (at 5 s)
def test_the_state_of_a_clock_is_the_state_of_every_beat(idle_from: int):
    full, thin = RunState(), RunState()
    b = HeartbeatBatcher("agent/n0", "n0")
    for i in range(3):
        for st in (full, thin):
            st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n0", via="agent/n0", ts=T0))
    for t in range(12):
        beats = [beat(t, src=f"rollout/{i}", cpu=5.0 if (i == 1 and t >= idle_from) else 60.0, mem=MEM)
                 for i in range(3)]
        full.apply(ev.HeartbeatsEvent(src="agent/n0", ts=T0 + t, beats=beats))
        for x in beats:
            b.add(x)
        e = taken(b, t + 0.5)
        assert e is not None
        thin.apply(e)
    for src, w in full.workers.items():
        t = thin.workers[src]
        assert heartbeat_at(thin, t) == heartbeat_at(full, w) == T0 + 11
        assert t.cpu_low_since == w.cpu_low_since and (t.cpu, t.rss, t.dropped, t.mem) == (w.cpu, w.rss, w.dropped,
                                                                                        w.mem)
    for key, s in full.mem_scopes.items():  # its numbers as every beat said them; its time, its last reading said's
        got = thin.mem_scopes[key]
        assert msgspec.structs.replace(got, ts=s.ts) == s and s.ts - FULL_BEAT_S < got.ts <= s.ts
    assert thin.workers["rollout/1"].cpu_low_since == T0 + idle_from - 1  # from the beat before its first idle one
    # the relay's roster: rollout/2 goes quiet (its newest, its own), the others' clock goes on
    for t in (12, 13, 14):
        for i in range(2):
            b.add(beat(t, src=f"rollout/{i}", cpu=5.0 if i == 1 else 60.0, mem=MEM))
        e = taken(b, t + 0.5)
        if e is not None:  # (none while rollout/2's newest holds the clock back and nothing else is new)
            thin.apply(e)
    assert heartbeat_at(thin, thin.workers["rollout/2"]) == T0 + 11  # silent since: the rule sees it so
    assert heartbeat_at(thin, thin.workers["rollout/0"]) == T0 + 14


def test_a_relay_started_again_vouches_for_none_of_the_workers_of_the_one_before():
    st = RunState()
    first = HeartbeatBatcher("agent/n0", "n0")
    for i in range(2):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n0", via="agent/n0", ts=T0))
        first.add(beat(0, src=f"rollout/{i}"))
    st.apply(taken(first, 0.5))
    again = HeartbeatBatcher("agent/n0", "n0")
    again.epoch = first.epoch + 10  # (its own start)
    again.add(beat(10, src="rollout/0"))  # rollout/1 died with the relay's node agent, say
    st.apply(taken(again, 10.5))
    again.add(beat(11, src="rollout/0"))
    st.apply(taken(again, 11.5))
    assert heartbeat_at(st, st.workers["rollout/0"]) == T0 + 11
    assert heartbeat_at(st, st.workers["rollout/1"]) == T0  # its own last: silent since, as it is


def test_a_batch_the_relay_could_not_send_is_followed_by_full_beats_and_its_roster_said_again():
    """A full beat dropped on the way (the supervisor's queue full) must not be the one later beats rely on,
    and who joined in it must be said again: the workers of a lost batch send in full next time."""
    b = HeartbeatBatcher("agent/n0", "n0")
    for i in range(3):
        b.add(beat(0, src=f"rollout/{i}"))
    assert taken(b, 0.5) is not None
    b.lost()  # the first batch, all full, never arrived
    for i in range(3):
        b.add(beat(1, src=f"rollout/{i}"))
    e = taken(b, 1.5)
    assert e is not None and len(e.beats) == 3 and e.clocks[0].joined == tuple(f"rollout/{i}" for i in range(3))
    for i in range(3):
        b.add(beat(2, src=f"rollout/{i}"))
    e = taken(b, 2.5)
    assert e is not None and e.beats == [] and e.clocks[0].ts == T0 + 2


def _node(st: RunState, n: int, relay: str = "agent/n0") -> None:
    for i in range(n):
        st.apply(ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, node="n0", via=relay, ts=T0))


def test_a_quiet_lost_on_the_way_leaves_a_worker_vouched_for_no_longer_than_its_full_beats_can_be_apart():
    """A relay's word that a worker went quiet, lost (a supervisor that died with it in its queue), must not
    keep that worker alive while its relay's clock moves on: the clock counts for it only ``vouch_s`` past
    its own newest full beat, which a live worker renews every ``FULL_BEAT_S``."""
    st = RunState()
    st.apply(ev.RunEvent(src="supervisor", ts=T0, state="running", heartbeat_s=1.0, heartbeat_log_s=10.0))
    assert st.vouch_s == vouch_s(1.0, 10.0) == 10.0 + FULL_BEAT_S + 3.0
    _node(st, 2)
    b = HeartbeatBatcher("agent/n0", "n0")
    for t in range(40):
        b.add(beat(t, src="rollout/0"))
        if t <= 2:
            b.add(beat(t, src="rollout/1"))  # rollout/1 stops after 2 s
        e = taken(b, t + 0.5)
        if e is not None and e.clocks[0].quiet:
            assert e.clocks[0].quiet == (("rollout/1", T0 + 2),)
            e = ev.HeartbeatsEvent(src=e.src, ts=e.ts, beats=e.beats, clocks=[ev.RelayClock(  # its quiet lost
                c.relay, c.epoch, c.ts, c.joined) for c in e.clocks])
        if e is not None:
            st.apply(e)
    stuck = st.workers["rollout/1"]
    assert stuck.clock_via == "agent/n0" and st.relay_clocks["agent/n0"][1] == T0 + 39  # still in the roster
    assert stuck.last_heartbeat == T0  # its newest full beat (its beats at 1 and 2 s said nothing new)
    assert heartbeat_at(st, stuck) == T0 + st.vouch_s  # and silent since then: the stale rule names it
    assert heartbeat_at(st, st.workers["rollout/0"]) == T0 + 39


def test_a_relay_started_again_in_a_merged_batch_vouches_for_none_of_the_dead_ones_workers():
    """The supervisor merges the batches that came one after the other (``Recorder._take_batches``): the old
    relay's last batch and its successor's first can be one event, whose full beats are of both."""
    st = RunState()
    _node(st, 2)
    first = HeartbeatBatcher("agent/n0", "n0")
    for t in range(3):
        for i in range(2):
            first.add(beat(t, src=f"rollout/{i}"))
        st.apply(taken(first, t + 0.5))
    for i in range(2):
        first.add(beat(5 + i, src=f"rollout/{i}", cpu=70.0 + 20 * i))  # full beats, in the dead relay's last batch
    last = taken(first, 6.5)
    again = HeartbeatBatcher("agent/n0", "n0")
    again.epoch = first.epoch + 10
    again.add(beat(7, src="rollout/0"))  # rollout/1 died with the old relay's node agent
    start = taken(again, 7.5)
    assert last is not None and start is not None
    st.apply(ev.HeartbeatsEvent(src="supervisor", ts=T0 + 8, beats=last.beats + start.beats,
                                clocks=last.clocks + start.clocks))
    for t in range(8, 30):
        again.add(beat(t, src="rollout/0"))
        e = taken(again, t + 0.5)
        if e is not None:
            st.apply(e)
    assert st.workers["rollout/1"].clock_via == ""
    assert heartbeat_at(st, st.workers["rollout/1"]) == T0 + 6  # its own last full beat: silent since
    assert heartbeat_at(st, st.workers["rollout/0"]) == T0 + 29


def test_the_clock_of_an_older_epoch_changes_nothing_the_newer_says():
    """An old relay still running beside its successor (or its last batch late) must neither undo the new
    one's roster nor put the old one's workers on it."""
    st = RunState()
    _node(st, 2)
    old, new = HeartbeatBatcher("agent/n0", "n0"), HeartbeatBatcher("agent/n0", "n0")
    new.epoch = old.epoch + 10
    new.add(beat(1, src="rollout/0"))  # rollout/1 died with the old relay's node
    st.apply(taken(new, 1.5))
    old.add(beat(0.5, src="rollout/1"))  # its last beat, in the old relay's late batch
    st.apply(taken(old, 2.5))
    assert st.relay_clocks["agent/n0"] == (new.epoch, T0 + 1)
    assert st.workers["rollout/0"].clock_via == "agent/n0"
    assert st.workers["rollout/1"].clock_via == ""
    assert heartbeat_at(st, st.workers["rollout/1"]) == T0 + 0.5


def test_a_worker_that_moves_to_another_relay_is_vouched_for_by_the_new_one_alone():
    st = RunState()
    _node(st, 1)
    a, b = HeartbeatBatcher("agent/n0", "n0"), HeartbeatBatcher("agent/n1", "n1")
    a.add(beat(0))
    st.apply(taken(a, 0.5))
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", rank=0, node="n1", via="agent/n1", ts=T0 + 1))
    for t in range(1, 6):
        b.add(beat(t))
        st.apply(taken(b, t + 0.5))
        e = taken(a, t + 0.5)  # the old relay says it quiet at 3 s
        if e is not None:
            st.apply(e)
    assert st.workers["rollout/0"].clock_via == "agent/n1"


def test_the_log_restates_a_vouched_for_workers_held_beat_once_its_full_beats_stop():
    """Its relay says it quiet; where that word never comes (the relay gone), the held beat is still restated,
    later than an unvouched worker's: full beats of a live one are up to ``FULL_BEAT_S`` apart."""
    log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
    kept: list = []
    log.admit_all([beat(0)], kept, mono=0.0, clocked=True)
    log.admit_all([beat(5)], kept, mono=5.0, clocked=True)  # held: nothing new, and not due
    assert len(kept) == 1
    assert log.silent(mono=5.0 + SILENT_BEATS + 1) == []  # an unvouched one's limit: not yet
    assert log.silent(mono=5.0 + SILENT_BEATS + FULL_BEAT_S + 1) == []  # a full beat can be a batch late
    [held] = log.silent(mono=5.0 + SILENT_BEATS + FULL_BEAT_S + 2 + 0.1)
    assert held.ts == T0 + 5


def test_a_worker_said_to_join_whose_first_beat_was_lost_is_not_heard_from_by_the_clock():
    """A relay says again who joined in a take that was lost; their full beats go with their next beats,
    which may come a batch later: until then the clock does not make up a heartbeat (nor one at 1970)."""
    st = RunState()
    _node(st, 1)
    st.apply(ev.HeartbeatsEvent(src="agent/n0", ts=T0 + 1, clocks=[ev.RelayClock("agent/n0", 1.0, T0 + 1,
                                                                                 ("rollout/0",))]))
    w = st.workers["rollout/0"]
    assert w.clock_via == "agent/n0" and heartbeat_at(st, w) == 0.0  # never heard from: not yet started
