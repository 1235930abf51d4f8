"""The log keeps a quiet worker's heartbeat every few seconds, every change a rule reads, and the
last one before a silence; a replay reads as the live state did."""

from __future__ import annotations

from gkd_core.runlog.heartbeats import HeartbeatLog
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_tui.sources.replay import ReplaySource


def beat(t, src="rollout/0", **kw):
    fields = {"phase": "generate", "cpu": 90.0, "rss": 1 << 30} | kw
    return ev.HeartbeatEvent(src=src, ts=1000.0 + t, **fields)


def test_a_quiet_worker_is_logged_every_period_and_each_change_with_the_beat_before():
    log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
    kept, restated = [], []
    for t in range(30):
        e = beat(t, cpu=2.0 if 14 <= t < 22 else 90.0, phase="train" if 20 <= t < 22 else "generate")
        now, before = log.admit(e, mono=t)
        if before is not None:
            restated.append(before.ts - 1000)
        if now:
            kept.append(t)
    # first; 10 s on; idle from 14 (13 first); busy again at 22 (21 first); a phase alone is no change
    assert kept == [0, 10, 14, 22]
    assert restated == [13, 21]
    assert log.silent(mono=30.0) == []  # 29 arrived just now
    last = log.silent(mono=32.0)
    assert [e.ts - 1000 for e in last] == [29]  # fell silent: its newest beat, once
    assert log.silent(mono=99.0) == []


def test_rss_growth_and_dropped_events_are_logged_when_they_change():
    log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
    assert log.admit(beat(0))[0]
    assert not log.admit(beat(1, rss=(1 << 30) + (10 << 20)))[0]  # 10 MB: noise
    assert log.admit(beat(2, rss=(1 << 30) + (100 << 20)))[0]
    assert log.admit(beat(3, rss=(1 << 30) + (100 << 20), dropped=4))[0]
    assert HeartbeatLog(every_s=0).admit(beat(0))[0] and HeartbeatLog(every_s=0).admit(beat(0.1))[0]


def test_replay_fills_the_left_out_beats_and_not_a_silence(tmp_path):
    log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
    lines = [ev.RunEvent(src="supervisor", state="starting", ts=999.0, heartbeat_s=1.0, heartbeat_log_s=10.0),
             ev.WorkerEvent(src="rollout/0", role="rollout", rank=0, ts=999.5)]
    for t in range(26):  # beats until 25, then silence
        now, before = log.admit(beat(t), mono=t)
        lines += [before] if before else []
        lines += [beat(t)] if now else []
    lines += log.silent(mono=40.0)
    lines.append(ev.LogEvent(src="driver", message="later", ts=1040.0))
    for i, e in enumerate(lines, 1):
        e.seq = i
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(wire.encode(e) for e in lines) + b"\n")
    assert sum(type(e) is ev.HeartbeatEvent for e in lines) == 4  # 0, 10, 20 and the last, 25

    r = ReplaySource(path)
    r.seek(1017.3)
    w = r.state.workers["rollout/0"]
    assert w.last_heartbeat == 1017.0  # as live: a beat a second, not "10 s ago"
    assert w.cpu == 90.0
    r.seek(1035.0)
    assert r.state.workers["rollout/0"].last_heartbeat == 1025.0  # silent since its last word
    r.to_start()
    r.to_end()
    assert r.state.workers["rollout/0"].last_heartbeat == 1025.0


def test_a_batch_admitted_at_once_keeps_what_one_by_one_keeps():
    """``admit_all`` (the supervisor's hot path) against ``admit``: the same beats kept, in the same order,
    each restated beat before the change after it, and the same held back for a silence."""
    import random

    rnd = random.Random(4)
    beats = [ev.Beat(f"rollout/{w}", 1000.0 + t, "generate", 0.0, (1 << 30) + rnd.choice((0, 0, 0, 200 << 20)),
                     rnd.choice((90.0, 90.0, 90.0, 1.0)), rnd.choice((0, 0, 0, 0, 3)))
             for t in range(40) for w in range(6)]
    one, many = HeartbeatLog(every_s=10.0, heartbeat_s=1.0), HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
    one_by_one: list = []
    for b in beats:
        logged, before = one.admit(b, mono=5.0)
        one_by_one += ([before] if before is not None else []) + ([b] if logged else [])
    at_once: list = []
    for k in range(0, len(beats), 16):  # batches of 16 beats
        many.admit_all(beats[k:k + 16], at_once, mono=5.0)
    assert at_once == one_by_one
    assert 40 < len(at_once) < len(beats)  # some, not all
    assert many.silent(mono=99.0) == one.silent(mono=99.0)
    everything: list = []
    HeartbeatLog(every_s=0).admit_all(beats[:5], everything)
    assert everything == beats[:5]


def test_a_relays_clock_is_kept_at_each_change_of_its_roster_and_once_a_period():
    """A relay's clock (the sign of life of the beats it did not send in full) is kept as a worker's quiet beats
    are: its first, each change of its roster (joined, quiet, a new epoch) at once, its time once a period;
    the newest held back is restated when the relay falls silent, and at the run's end."""
    log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)

    def clock(t: float, **kw) -> ev.RelayClock:
        return ev.RelayClock("agent/n0", kw.pop("epoch", 900.0), 1000.0 + t, **kw)

    kept: list = []
    log.clocks.admit([clock(0, joined=("rollout/0", "rollout/1"))], kept, mono=0.0)
    for t in range(1, 12):
        log.clocks.admit([clock(t)], kept, mono=float(t))
    log.clocks.admit([clock(12, quiet=(("rollout/1", 1009.5),))], kept, mono=12.0)
    log.clocks.admit([clock(13)], kept, mono=13.0)
    log.clocks.admit([clock(14, epoch=990.0, joined=("rollout/0",))], kept, mono=14.0)  # the relay started again
    assert [c.ts for c in kept] == [1000.0, 1010.0, 1012.0, 1014.0]
    assert kept[2].quiet == (("rollout/1", 1009.5),) and kept[3].epoch == 990.0
    log.clocks.admit([clock(15, epoch=990.0)], kept, mono=15.0)
    assert log.clocks.silent(mono=16.0) == []  # its next batch is not late yet
    [restated] = log.clocks.silent(mono=18.0)  # then it falls silent: its newest, once
    assert restated.ts == 1015.0 and log.clocks.silent(mono=99.0) == []


def test_a_replay_fills_a_gap_of_a_vouched_for_worker_from_its_newest_full_beat(tmp_path):
    """A worker a relay's clock vouches for: its full beats come in its relay's batches, and the log may restate
    one alone later (it fell silent, or the run ended). The gap before that one is filled from the newest beat of
    the worker the log holds, in a batch or not: not with the numbers of an older one, over a crossing of the
    idle line that came between (a replay from a keyframe before the crossing once showed it busy)."""
    def full(t, cpu):
        return ev.Beat("rollout/0", 1000.0 + t, "generate", 0.0, 1 << 30, cpu, 0, None)

    def batch(t, *beats, **kw):
        return ev.HeartbeatsEvent(src="supervisor", ts=1000.0 + t, beats=list(beats),
                                  clocks=[ev.RelayClock("agent/n0", 900.0, 1000.0 + t, **kw)])

    lines = [ev.RunEvent(src="supervisor", state="starting", ts=999.0, heartbeat_s=1.0, heartbeat_log_s=10.0),
             ev.WorkerEvent(src="rollout/0", role="rollout", rank=0, via="agent/n0", ts=999.5),
             beat(0, cpu=50.0),  # logged alone: its first
             batch(0, joined=("rollout/0",)),
             batch(4, full(3, 50.0), full(4, 2.0)),  # idle from 4, with the beat before it
             beat(9, cpu=2.0),  # its held beat, restated
             ev.LogEvent(src="driver", message="later", ts=1012.0)]
    for i, e in enumerate(lines, 1):
        e.seq = i
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(wire.encode(e) for e in lines) + b"\n")

    r = ReplaySource(path)
    for t in (4.5, 6.2, 8.5, 11.0):
        r.seek(1000.0 + t)
        assert r.state.workers["rollout/0"].cpu == 2.0, t
    r.seek(3.5 + 1000.0)
    assert r.state.workers["rollout/0"].cpu == 50.0


def test_the_silent_are_those_a_walk_over_every_worker_finds_reading_only_those_due():
    """``silent`` reads the beats held longest (its queues), not every worker; what it restates is what a walk finds:
    workers held past their limit (a vouched-for worker's own, longer), each once, on random runs."""
    import random

    from gkd_core.runlog.heartbeats import SILENT_BEATS
    from gkd_core.telemetry.events import FULL_BEAT_S, Beat

    for seed in range(8):
        rnd = random.Random(seed)
        log = HeartbeatLog(every_s=10.0, heartbeat_s=1.0)
        mono = 0.0
        for _ in range(400):
            mono += rnd.choice((0.0, 0.1, 0.5, 1.0, 3.0))
            clocked = rnd.random() < 0.5
            batch = [Beat(f"rollout/{rnd.randrange(30)}", 1000.0 + mono + rnd.random(), "generate",
                          rnd.choice((90.0, 90.0, 1.0)), 1 << 30) for _ in range(rnd.randrange(4))]
            if rnd.random() < 0.5:
                log.admit_all(batch, [], mono=mono, clocked=clocked)
            else:
                for b in batch:
                    log.admit(b, mono=mono)
            if rnd.random() < 0.05:
                log.quiet(f"rollout/{rnd.randrange(30)}")
            if rnd.random() < 0.3:
                limit = SILENT_BEATS * 1.0
                walked = {src for src, s in log._srcs.items() if s.held is not None
                          and mono - s.held_at > (limit + FULL_BEAT_S + 2.0 if s.clocked else limit)}
                assert {b.src for b in log.silent(mono=mono)} == walked
