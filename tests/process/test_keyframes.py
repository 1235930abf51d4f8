"""Keyframes: the supervisor writes its state from a forked child now and then, and a replay starts
from the newest one before where it is asked to be, to the same state as a replay of the whole log."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from conftest import wait_until

from gkd_core import config, rundir
from gkd_core.runlog import keyframes as kf
from gkd_core.runlog import reader
from gkd_core.runlog.eventlog import EventLog
from gkd_core.state import RunState
from gkd_core.state.views import heartbeat_at
from gkd_core.supervisor.supervisor import Supervisor
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.relay import HeartbeatBatcher
from gkd_tui.sources.replay import ReplaySource

PHASES = ("generate", "teacher_wait", "train", "sync_weights")
HB = 0.2


def comparable(w):
    """A worker as a replay rebuilds it: ``last_seen`` is moved by the copies of left-out heartbeats a replay
    puts back."""
    return msgspec.structs.replace(w, last_seen=0.0)


def assert_same(a: RunState, b: RunState, heartbeat_within: float) -> None:
    assert sorted(a.workers) == sorted(b.workers)
    for src, w in a.workers.items():
        x = b.workers[src]
        assert (w.phase, w.step, w.phase_since, w.spans) == (x.phase, x.step, x.phase_since, x.spans), src
        beat, other = heartbeat_at(a, w), heartbeat_at(b, x)  # (its own, or its relay's clock)
        assert abs(beat - other) <= heartbeat_within, (src, beat, other)
    assert sorted(a.alerts) == sorted(b.alerts)
    assert (a.state, a.step, a.sync, a.metrics) == (b.state, b.step, b.sync, b.metrics)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A run of 32 workers on 4 nodes through a real supervisor, with a keyframe every 10 KB of log,
    and its live state at the end."""
    from conftest import RunningSupervisor  # one supervisor for the module's tests

    home = tmp_path_factory.mktemp("kf")
    env = dict(os.environ, GKD_HOME=str(home), GKD_DEMO_STEP_S="0.05")
    sup = RunningSupervisor(home, ["trainer.total_steps=100000", f"telemetry.heartbeat_s={HB}",
                                   "telemetry.heartbeat_log_s=1.0", "telemetry.keyframe_mb=0.01",
                                   "--driver", "gkd_core.demo_driver"], env)
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.connect(sup.endpoints["ingest"])
    try:
        nodes, per_node = 4, 8
        srcs = [f"rollout/{i}" for i in range(nodes * per_node)]
        for i, src in enumerate(srcs):
            push.send(wire.encode(ev.WorkerEvent(src=src, role="rollout", rank=i, node=f"n{i // per_node}",
                                               via=f"agent/n{i // per_node}", ts=time.time())))
        batchers = [HeartbeatBatcher(f"agent/n{n}", f"n{n}") for n in range(nodes)]
        t0 = time.time()
        step = 0
        while time.time() - t0 < 5.0:  # a step every 0.4 s: four phases, all workers together
            for p in PHASES:
                for src in srcs:
                    push.send(wire.encode(ev.PhaseEvent(src=src, phase=p, step=step, ts=time.time())))
                for n, b in enumerate(batchers):
                    for i in range(n * per_node, (n + 1) * per_node):
                        idle = i == 5 and time.time() - t0 > 2.5  # a change the log keeps
                        b.add(ev.Beat(srcs[i], time.time(), p, 0.0, 1 << 30, 1.0 if idle else 90.0, 0))
                    push.send_multipart(b.take())
                time.sleep(0.1)
            step += 1
        time.sleep(0.5)
        with sup.client() as c:
            live = msgspec.convert(c.request("snapshot")["state"], RunState)
            c.request("stop")
        assert sup.wait_exit() == 143
    finally:
        push.close(linger=0)
        ctx.term()
        sup.kill()
    return sup.run, live


def test_the_supervisor_writes_keyframes_of_its_log_and_keeps_the_newest(recorded):
    run, _ = recorded
    files = kf.frames(run / "keyframes")
    log = run / "events.jsonl"
    assert 2 <= len(files) <= kf.KEEP, [f.name for f in files]
    assert not list((run / "keyframes").glob(".*"))  # no writer left a temporary file
    headers = [kf.read_header(f) for f in files]
    for f, h in zip(files, headers, strict=True):
        assert (f.stat().st_mode & 0o777) == 0o600
        assert kf.mismatch(h, log, log.stat().st_size) == "", f.name
        data = log.read_bytes()[:h.offset]
        assert data.count(b"\n") == h.lines and data.endswith(b"\n")
        # the newest ts of the lines before it, or of a heartbeat the log left out (thinned), which the
        # state it carries holds (its newest event's ts, and each worker's last beat, which can differ from
        # that event's ts in the last digit): a replay seeking past the log's lines must still land on it
        logged = max(wire.decode(line).ts for line in data.splitlines())
        state = kf.load(f)
        beats = max((w.last_heartbeat for w in state.workers.values()), default=0.0)
        clocks = max((ts for _, ts in state.relay_clocks.values()), default=0.0)
        assert h.max_ts >= logged and h.max_ts == max(logged, state.last_ts, beats, clocks), \
            (h.max_ts, logged, state.last_ts, beats, clocks)
        head, state, end = f.read_bytes().split(b"\n")  # the header, then the state as a snapshot has it
        assert head.startswith(b'{"format":%d,' % kf.FORMAT) and state.startswith(b'{"run":') and end == b""
    assert [h.seq for h in headers] == sorted(h.seq for h in headers)
    # about one per 10 KB of log; more were written than kept; the newest at the run's end (the lines after it:
    # what the supervisor said as it closed)
    assert headers[-1].offset >= log.stat().st_size // 2
    assert log.stat().st_size - headers[-1].offset < int(0.01 * (1 << 20)) // kf.END_SHARE
    assert headers[0].seq > 1


def test_a_replay_from_keyframes_is_the_replay_of_the_whole_log(recorded, monkeypatch):
    run, live = recorded
    monkeypatch.setattr(reader, "CHUNK", 2048)  # many chunks: gaps, steps and jumps across their ends
    log = run / "events.jsonl"
    framed, whole = ReplaySource(log), ReplaySource(log, keyframes=False)
    assert framed.frames and not whole.frames and framed.warning() == ""
    framed.to_end()
    whole.to_end()
    newest = framed.frames[-1][0]
    assert framed.base is framed.frames[-1]  # the end is the newest keyframe and the lines after it
    assert len(framed.events) < len(whole.events) == newest.lines + len(framed.events)
    assert f"{len(whole.events)}/{len(whole.events)}" in framed.describe()
    for src, w in whole.state.workers.items():
        assert comparable(framed.state.workers[src]) == comparable(w), src
    framed.seek(live.last_ts)  # the live state's newest event: after it, the run was stopped
    assert_same(framed.state, live, 1.5 * HB)
    # anywhere in between: from the keyframe before, forward and back, and from the start
    first, last = whole.events[0].ts, whole.events[-1].ts
    started_from = set()
    for at in (first + 0.3, *(h.max_ts + d for h, _ in framed.frames for d in (-0.01, 0.0, 0.05)), last - 1.0,
               first + 2.0):
        framed.seek(at)
        if framed.base:
            started_from.add(framed.base[0].seq)
        again = ReplaySource(log, keyframes=False)
        again.seek(at)
        assert_same(framed.state, again.state, 1.5 * HB)
        assert framed.now() == again.now() == at
    assert started_from == {h.seq for h, _ in framed.frames}  # from each keyframe
    framed.to_start()
    assert framed.base is None and framed.state == RunState()
    for _ in range(50):  # stepping over chunk ends, as → does
        framed.step()
    again = ReplaySource(log, keyframes=False)
    again.seek(framed.now())
    assert_same(framed.state, again.state, 1.5 * HB)
    framed.to_end()
    assert comparable(framed.state.workers["rollout/5"]) == comparable(whole.state.workers["rollout/5"])


def test_a_damaged_or_foreign_keyframe_is_passed_over_and_named(recorded, tmp_path):
    run, _ = recorded
    log = tmp_path / "events.jsonl"
    log.write_bytes((run / "events.jsonl").read_bytes())
    (tmp_path / "keyframes").mkdir()
    files = kf.frames(run / "keyframes")
    for f in files:
        (tmp_path / "keyframes" / f.name).write_bytes(f.read_bytes())
    newest, before = tmp_path / "keyframes" / files[-1].name, tmp_path / "keyframes" / files[-2].name
    whole = ReplaySource(log, keyframes=False)
    whole.to_end()

    newest.write_bytes(newest.read_bytes()[:-100])  # cut short: the header reads, the state does not
    r = ReplaySource(log)
    r.to_end()
    assert r.base[1] == before and newest.name in r.warning() and "unreadable state" in r.warning()
    assert_same(r.state, whole.state, 1e-9)

    # a keyframe of another log: its line is not this log's
    h = kf.read_header(before)
    forged = msgspec.structs.replace(h, last_line_sha256="0" * 64)
    body = before.read_bytes().split(b"\n", 1)[1]
    before.write_bytes(msgspec.json.encode(forged) + b"\n" + body)
    newest.unlink()
    r = ReplaySource(log)
    assert before.name in r.warning() and "not the one it was written at" in r.warning()
    r.to_end()
    assert before not in [p for _, p in r.frames]
    assert (r.base[1].name if r.base else None) == (files[-3].name if len(files) > 2 else None)
    assert_same(r.state, whole.state, 1e-9)

    (tmp_path / "keyframes" / "seq-000000000099.jsonl").write_bytes(b"not json")
    assert "unreadable header" in ReplaySource(log).warning()


def test_the_writer_forks_reaps_and_reports_a_child_that_fails_or_overruns(tmp_path, monkeypatch):
    log = EventLog(tmp_path / "events.jsonl")
    st = RunState()
    for i in range(3):
        e = ev.WorkerEvent(src=f"rollout/{i}", role="rollout", rank=i, ts=100.0 + i, seq=i + 1)
        log.append(wire.encode(e), e.ts)
        st.apply(e)
    log.flush()
    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=1e-6, keep=2)
    for seq in (3, 4, 5):  # one at a time: started, then reaped before the next
        assert w.tick(st, log, seq) == "" and w.pid
        pid = w.pid
        wait_until(lambda seq=seq: w.tick(st, log, seq) == "" and not w.pid, 10, "the writer done")
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped: no zombie left
        # the next is due when the log grew by as much as this one's size (keyframe_mb is a byte here)
        assert w.last_size == kf.frames(tmp_path / "keyframes")[-1].stat().st_size > 1000
        log.append(wire.encode(ev.LogEvent(src="driver", message="more" * (w.last_size // 8), ts=110.0 + seq,
                                           seq=seq)), 110.0 + seq)
        log.flush()
        assert (w.tick(st, log, seq), w.pid) == ("", 0)  # half its size: not yet
        log.append(wire.encode(ev.LogEvent(src="driver", message="more" * (w.last_size // 8), ts=110.0 + seq,
                                           seq=seq)), 110.0 + seq)
        log.flush()
    assert w.written == 3
    assert [p.name for p in kf.frames(tmp_path / "keyframes")] == ["seq-000000000004.jsonl", "seq-000000000005.jsonl"]
    h = kf.read_header(kf.frames(tmp_path / "keyframes")[-1])
    assert (h.seq, h.lines, h.max_ts) == (5, 7, 114.0)
    assert kf.load(kf.frames(tmp_path / "keyframes")[-1]) == st

    def fails(state):
        raise ValueError("the disk said no")
    monkeypatch.setattr(kf, "encode_state", fails)  # the child is a fork: it has this patch too
    assert w.tick(st, log, 6) == ""
    said = wait_until(lambda: w.tick(st, log, 6), 10, "the writer's failure")
    assert "seq 6 not written (exit 1): ValueError: the disk said no" in said and not w.pid

    monkeypatch.setattr(kf, "encode_state", lambda state: time.sleep(60))
    log.append(b'{"v":"%s"}' % (b"x" * w.last_size), 120.0)
    w.deadline_s = 0.3
    assert w.tick(st, log, 7) == ""
    said = wait_until(lambda: w.tick(st, log, 7), 10, "the overrun named")
    assert "not written within 0.3 s" in said and "killed" in said
    wait_until(lambda: not w.tick(st, log, 7) and not w.pid, 10, "the killed writer reaped")
    assert not list((tmp_path / "keyframes").glob(".*.tmp"))
    assert len(kf.frames(tmp_path / "keyframes")) == 2  # the good ones stay

    log.append(b'{"v":"%s"}' % (b"x" * w.last_size), 130.0)
    assert w.tick(st, log, 8) == "" and w.pid
    assert "abandoned" in w.close(wait_s=0.2) and not w.pid
    log.close()


def test_the_runs_end_has_a_keyframe_of_its_own_when_the_log_grew_enough_since_the_last(tmp_path, monkeypatch):
    """A finished run opens at its end from a keyframe there, not from up to keyframe_mb of lines before it;
    one whose log grew by less than an END_SHARE-th of keyframe_mb since the last gets none (that one is near)."""
    every_mb = 0.01
    step = int(every_mb * (1 << 20))
    log = EventLog(tmp_path / "events.jsonl")
    st = RunState()
    seq = 0

    def grow(n_bytes: int) -> int:
        nonlocal seq
        start = log.offset
        while log.offset - start < n_bytes:
            seq += 1
            e = ev.LogEvent(src="driver", message="x" * 100, ts=100.0 + seq, seq=seq)
            log.append(wire.encode(e), e.ts)
            st.apply(e)
        log.flush()
        return seq

    def seqs() -> list[int]:
        return [kf.read_header(f).seq for f in kf.frames(tmp_path / "keyframes")]

    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=every_mb)
    due = grow(step)
    assert w.tick(st, log, seq) == "" and w.pid  # the one due by size, still at work when the run ends
    grow(step // kf.END_SHARE // 2)  # then less than a share more
    assert w.close(end_of=(st, log, seq)) == "" and not w.pid
    assert seqs() == [due]

    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=every_mb)
    end = grow(step // kf.END_SHARE + 1)
    assert w.close(end_of=(st, log, seq)) == "" and not w.pid
    assert seqs() == [due, end]
    h = kf.read_header(kf.frames(tmp_path / "keyframes")[-1])
    assert (h.offset, h.lines) == (log.offset, log.line_no) and kf.load(kf.frames(tmp_path / "keyframes")[-1]) == st

    # one still at work when the run ends is abandoned: the end's own is measured from the last one written
    slow, started = tmp_path / "slow", tmp_path / "started"
    slow.touch()
    encode = kf.encode_state

    def held(state):
        started.touch()
        while slow.exists():
            time.sleep(0.01)
        return encode(state)
    monkeypatch.setattr(kf, "encode_state", held)  # (the child is a fork: it has this patch too)
    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=every_mb)
    grow(step)
    assert w.tick(st, log, seq) == "" and w.pid
    wait_until(started.exists, 10, "the writer at work")
    slow.unlink()  # (the one at work sleeps on: it looked before)
    grow(step // kf.END_SHARE // 2)  # less than a share since the one abandoned, more since the one written
    said = w.close(wait_s=0.0, end_of=(st, log, seq))
    assert "abandoned" in said and seqs() == [due, end, seq]
    log.close()


def test_a_log_taken_over_knows_where_it_stands_and_so_does_its_writer(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    st = RunState()
    for i in range(5):
        e = ev.LogEvent(src="driver", message="x" * (i * 100), ts=100.0 + i, seq=i + 1)
        log.append(wire.encode(e), e.ts)
        st.apply(e)
    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=1e-6)
    log.flush()
    assert w.tick(st, log, 5) == ""
    wait_until(lambda: not w.tick(st, log, 5) and not w.pid, 10, "the writer done")
    log.close()
    # as a supervisor taking the run over opens it
    again = EventLog(path, max_ts=st.last_ts)
    data = path.read_bytes()
    assert (again.offset, again.line_no, again.last_line) == (len(data), 5, data.splitlines()[-1])
    taken = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=1e-6)
    assert (taken.last_offset, taken.last_size) == (len(data), kf.frames(tmp_path / "keyframes")[-1].stat().st_size)
    again.append(b'{"v":1}', 200.0)
    again.close()
    assert (again.offset, again.line_no, again.max_ts) == (len(data) + 8, 6, 200.0) == \
        (path.stat().st_size, path.read_bytes().count(b"\n"), 200.0)


def test_a_bad_line_after_a_keyframe_is_named_once_by_its_number(recorded, tmp_path, monkeypatch):
    run, _ = recorded
    monkeypatch.setattr(reader, "CHUNK", 2048)
    data = (run / "events.jsonl").read_bytes()
    newest = kf.frames(run / "keyframes")[-1]
    h = kf.read_header(newest)
    lines = data.split(b"\n")
    at = h.lines + 1  # the first line after the keyframe
    lines[at - 1] = b'{"torn'
    log = tmp_path / "events.jsonl"
    log.write_bytes(b"\n".join(lines))
    (tmp_path / "keyframes").mkdir()
    (tmp_path / "keyframes" / newest.name).write_bytes(newest.read_bytes())
    r = ReplaySource(log)
    r.to_end()
    assert r.base is not None and [n for n, _ in r.skipped] == [at]
    r.to_start()
    r.to_end()  # read again from the start, then from the keyframe: still one
    r.seek(r.frames[0][0].max_ts - 1.0)
    r.to_end()
    assert [n for n, _ in r.skipped] == [at] and f"line {at}" in r.warning()


def test_replay_take_over_and_the_dashboard_read_one_state_from_one_log(recorded, tmp_path):
    """The three readers of a run log: ``replay`` (status of a run whose supervisor is gone), a
    supervisor that takes the run over, and the dashboard's replay (from a keyframe, and from the
    start). The log ends with a line torn by a killed supervisor."""
    run, _ = recorded
    copy = tmp_path / run.name
    shutil.copytree(run, copy, ignore=lambda d, names: [n for n in names if (Path(d) / n).is_socket()])
    log = copy / reader.EVENTS
    with open(log, "ab") as f:
        f.write(b'{"v":1,"seq":99999999,"kind":"log","mess')
    torn = log.read_bytes().count(b"\n") + 1

    skipped: list[tuple[int, str]] = []
    whole = reader.replay(log, skipped)
    assert [n for n, _ in skipped] == [torn]
    framed, unframed = ReplaySource(log), ReplaySource(log, keyframes=False)
    framed.to_end()
    unframed.to_end()
    assert framed.base is not None and [n for n, _ in framed.skipped] == [n for n, _ in unframed.skipped] == [torn]

    mask = os.umask(0o022)
    try:
        sup = Supervisor(config.load_config(rundir.latest_config(copy)), home=tmp_path, resume=copy)
    finally:
        os.umask(mask)
    try:
        taken = sup.state
        assert sup.seq == whole.last_seq > 0
    finally:
        sup.close()
    assert taken == whole  # the torn line cut off (and kept aside) rather than skipped: the same state
    assert (copy / "events.jsonl.torn").read_bytes().startswith(b'{"v":1,"seq":99999999')
    # the dashboard's replay puts back the heartbeats the log left out: they move a worker's
    # ``last_seen``, ``moved`` and the count of events applied, and nothing else
    for replayed in (framed.state, unframed.state):
        assert replayed.applied > whole.applied
        assert {s: comparable(w) for s, w in replayed.workers.items()} == \
               {s: comparable(w) for s, w in whole.workers.items()}
        assert msgspec.structs.replace(replayed, applied=0, workers={}) == \
               msgspec.structs.replace(whole, applied=0, workers={})


def test_a_keyframe_due_in_a_burst_of_events_waits_for_its_end_or_at_most_defer_max_s(tmp_path):
    """While the child lives, every page the supervisor writes is copied: a keyframe due in a step's burst of
    phase changes is forked a second after the burst, not in it, and never more than DEFER_MAX_S late."""
    log = EventLog(tmp_path / "events.jsonl")
    st = RunState()
    w = kf.KeyframeWriter(tmp_path / "keyframes", every_mb=1e-6)
    assert w.tick(st, log, 0, now=0.0) == "" and not w.pid  # nothing logged yet: the count starts

    def grow(seq: int) -> None:  # (past the last keyframe's size: due)
        log.append(wire.encode(ev.LogEvent(src="driver", message="more" * (w.last_size // 4 + 1), ts=100.0 + seq,
                                           seq=seq)), 100.0 + seq)
        log.flush()

    grow(1)
    burst = kf.BURST_PER_S  # events a second
    assert w.tick(st, log, burst // 2, now=0.5) == "" and not w.pid  # due, in a burst: waits
    assert w.tick(st, log, burst // 2 + 1, now=1.0) == "" and not w.pid  # the burst over a moment ago: still waits
    assert w.tick(st, log, burst // 2 + 2, now=1.6) == "" and w.pid  # a second after it: forked
    wait_until(lambda: w.tick(st, log, burst // 2 + 2, now=1.7) == "" and not w.pid, 10, "the writer done")
    assert w.written == 1

    grow(2)
    seq, now = burst, 2.0
    while now < 3.0 + kf.DEFER_MAX_S:  # a burst that goes on: the keyframe waits at most DEFER_MAX_S
        seq, now = seq + burst // 4, now + 0.25
        w.tick(st, log, seq, now=now)
        if w.pid:
            break
    assert w.pid and now == pytest.approx(2.25 + kf.DEFER_MAX_S, abs=0.3)
    wait_until(lambda: w.tick(st, log, seq, now=now + 0.1) == "" and not w.pid, 10, "the writer done")
    log.close()
