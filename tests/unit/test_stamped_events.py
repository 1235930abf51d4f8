"""A worker's event as its sender encoded it (``wire.decode_stampable``) is stamped and encoded once, with no
untyped parse: the line logged and published is the one the general way (``decode_dict``, the raw object
stamped, ``encode_dict``) writes, and anything that way would write otherwise takes it."""

from __future__ import annotations

import time

import pytest
from fuzzing import event_objects, fuzz
from hypothesis import given

from gkd_core.runlog.eventlog import EventLog
from gkd_core.runlog.heartbeats import HeartbeatLog
from gkd_core.state import RunState
from gkd_core.supervisor.recorder import Recorder
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.events import MAX_DEPTH


def recorder(tmp_path, name: str) -> tuple[Recorder, list[tuple[bytes, bytes]]]:
    published: list[tuple[bytes, bytes]] = []
    rec = Recorder("run-1", RunState(), EventLog(tmp_path / f"{name}.jsonl"), HeartbeatLog(),
                   lambda kind, line: published.append((kind, line)))
    return rec, published


def the_general_way(rec: Recorder, data: bytes) -> None:
    obj, typed = wire.decode_dict(data)
    rec.commit(obj, typed, obj["kind"].encode())


@fuzz(300)
@given(obj=event_objects(hostile=True))
def test_a_stamped_event_is_logged_and_published_as_the_general_way_writes_it(tmp_path_factory, obj):
    data = wire.encode_dict(obj)  # as a stranger writes it: its keys in any order, fields of its own
    try:
        _, typed = wire.decode_dict(data)
    except wire.Rejected:
        assert wire.decode_stampable(data) is None  # what the general way refuses, this one does too
        return
    if not isinstance(typed, ev.Event):
        assert wire.decode_stampable(data) is None  # (a kind this reader does not know: kept whole)
        return
    typed.seq, typed.run = 0, ""
    ours = wire.encode(typed)  # as a sender of ours writes the same event
    for sent in (data, ours):
        tmp = tmp_path_factory.mktemp("stamped")
        general, general_out = recorder(tmp, "general")
        fast, fast_out = recorder(tmp, "fast")
        the_general_way(general, sent)
        stamped = wire.decode_stampable(sent)
        if sent is ours:  # ours take this way whenever they say when they were sent
            assert (stamped is not None) == bool(typed.ts)
        if stamped is not None:
            fast.commit_stamped(stamped)
            assert fast_out == general_out  # the same bytes, to the subscribers and (below) in the log
            general.close()
            fast.close()
            assert (tmp / "fast.jsonl").read_bytes() == (tmp / "general.jsonl").read_bytes()


def nested_list(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out


def phase_bytes(**fields) -> bytes:
    return wire.encode(ev.PhaseEvent(**{"src": "rollout/1", "phase": "generate", "detail": "progress 5",
                                        "ts": time.time(), **fields}))


@pytest.mark.parametrize("why, data", [
    ("a seq of its own", phase_bytes(seq=7)),
    ("a run of its own", phase_bytes(run="another")),
    ("no ts", phase_bytes(ts=0.0)),
    ("a field of a newer writer", phase_bytes()[:-1] + b',"newer":{"a":1}}'),
    ("a space", phase_bytes().replace(b'"phase":', b'"phase": ')),
    ("a line break", phase_bytes().replace(b',"detail"', b',\n"detail"')),
    ("a key written twice", phase_bytes()[:-1] + b',"phase":"train"}'),
    ("a kind this reader does not know", b'{"kind":"zzz_future","v":1,"seq":0,"ts":1.5,"run":"","src":"a"}'),
    ("a newer version", phase_bytes().replace(b'"v":1', b'"v":2')),
    ("nested deeper than MAX_DEPTH", wire.encode(ev.AlertEvent(code="x", severity="warn", message="m", ts=1.5,
                                                               evidence={"deep": nested_list(MAX_DEPTH + 5)}))),
])
def test_what_the_sender_wrote_otherwise_takes_the_general_way(tmp_path, why, data):
    assert wire.decode_stampable(data) is None, why
    rec, out = recorder(tmp_path, "general")
    try:
        the_general_way(rec, data)
    except wire.Rejected:
        assert why in ("a newer version", "nested deeper than MAX_DEPTH")  # refused, and counted by the ingest
        return
    kind, line = out[0]
    assert b'"seq":1' in line and b'"run":"run-1"' in line
    if why == "a field of a newer writer":
        assert b'"newer":{"a":1}' in line  # kept, as the general way keeps it
