"""Hostile input, fuzzed: what a stranger, a bug or a torn disk can hand each part that reads input.

Every property runs with a fixed seed (``derandomize``) and a bounded number of examples, so CI is
deterministic and bounded in time. The reducer, the config loader and the log readers are fuzzed
in-process with many examples; the dashboard under Textual's pilot with a handful (the supervisor
over its real sockets: tests/process/test_fuzz_processes.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from fuzzing import (
    ANY_FLOAT,
    CONFIG_KEYS,
    CONFIG_VALUES,
    DEEP,
    JSON_VALUES,
    NOW,
    TS,
    check_loaded,
    check_refused,
    check_state,
    encode,
    event_objects,
    fuzz,
    torn_logs,
    torn_yaml,
    write_log,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st

from gkd_core import config as config_mod
from gkd_core.runlog.reader import replay
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_tui.sources.replay import ReplaySource


@fuzz(400)
@given(objs=st.lists(event_objects(hostile=False) | event_objects(), min_size=1, max_size=25), now=TS)
# periods near the float's end: the liveness's vouching time once overflowed to inf, which no keyframe holds
@example(objs=[{"kind": "run", "v": 1, "src": "driver", "ts": 1795384800.0, "state": "starting",
                "heartbeat_s": 1.7976931348623157e308, "heartbeat_log_s": 0.0}], now=1795384800.0)
def test_the_reducer_and_the_diagnosis_take_any_event_that_decodes(objs, now):
    state = RunState()
    for seq, obj in enumerate(objs, 1):
        obj["seq"] = seq
        try:
            e = wire.decode(encode(obj))
        except wire.Rejected as r:
            assert r.reason in ("garbage", "malformed", "oversized", "version") and "\n" not in str(r)
            continue
        state.apply(e)
        if isinstance(e, ev.Event):  # what is accepted survives the log: written and read back, the same
            assert wire.decode(wire.encode(e)) == e
    check_state(state, now)


@fuzz(300)
@given(obj=event_objects(), data=st.data())
def test_the_supervisors_decoder_drops_what_it_cannot_log_and_keeps_the_rest(obj, data):
    """``decode_dict`` (the ingest's): a message is dropped with a reason, or it is logged as it is
    and every reader of the log gets the same event back."""
    if data.draw(st.booleans()):  # a wrong type for an envelope field
        obj[data.draw(st.sampled_from(["src", "run", "ts", "seq", "v", "kind"]))] = data.draw(JSON_VALUES)
    try:
        raw, typed = wire.decode_dict(encode(obj))
    except wire.Rejected as r:
        assert r.reason in ("garbage", "malformed", "version") and "\n" not in r.detail
        return
    raw["seq"], raw["run"] = 7, "r"
    raw["ts"] = raw.get("ts") or NOW
    again = wire.decode(wire.encode_dict(raw))  # the line as events.jsonl holds it, read by a replay
    assert again.kind == typed.kind == raw["kind"]
    RunState().apply(again)


@fuzz(200)
@given(data=st.binary(max_size=300) | st.text(max_size=300).map(str.encode) | JSON_VALUES.map(encode) | DEEP)
def test_decoding_garbage_raises_only_rejected(data):
    for decode in (wire.decode, wire.decode_dict):
        try:
            decode(data)
        except wire.Rejected as r:
            assert r.reason in ("garbage", "malformed", "oversized", "version")


@fuzz(300)
@given(key=st.sampled_from(CONFIG_KEYS), value=CONFIG_VALUES, raw=st.booleans())
def test_any_value_for_a_known_key_loads_or_is_refused_naming_the_key(key, value, raw):
    name, _ = key
    text = value if raw and isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True, width=10**9)
    text = text.removesuffix("\n...\n").strip()
    assume("\n" not in text)  # an override is one command-line word
    try:
        cfg = config_mod.load_config(None, [f"{name}={text}"])
    except config_mod.ConfigError as e:
        check_refused(e, name)
    else:
        check_loaded(cfg)


@fuzz(200)
@given(values=st.dictionaries(st.sampled_from(CONFIG_KEYS).map(lambda k: k[0]), CONFIG_VALUES, min_size=1,
                              max_size=3))
def test_a_yaml_file_of_odd_values_loads_or_is_refused_naming_the_key_and_the_file(values):
    tree: dict = {}
    for key, value in values.items():
        section, _, leaf = key.partition(".")
        if leaf:
            tree.setdefault(section, {})[leaf] = value
        else:
            tree[section] = value
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "odd.yaml"
        path.write_text(yaml.safe_dump(tree))
        try:
            cfg = config_mod.load_config(path)
        except config_mod.ConfigError as e:
            check_refused(e, *values)
            assert str(path) in str(e)
        else:
            check_loaded(cfg)


@fuzz(300)
@given(data=torn_yaml())
def test_a_torn_or_garbage_yaml_file_loads_or_is_refused_in_one_line(data):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "torn.yaml"
        path.write_bytes(data)
        try:
            cfg = config_mod.load_config(path)
        except config_mod.ConfigError as e:
            check_refused(e, str(path))
        else:
            check_loaded(cfg)


@fuzz(200)
@given(log=torn_logs())
def test_replay_of_a_torn_log_skips_each_bad_line_by_number_and_keeps_every_event(log):
    lines, bad = log
    with tempfile.TemporaryDirectory() as d:
        path = write_log(Path(d), lines)
        src = ReplaySource(path)
    good = [wire.decode(line) for n, line in enumerate(lines, 1) if line and n not in bad]
    assert src.events == good  # every event, in the file's order
    assert [n for n, _ in src.skipped] == bad
    note = src.warning()
    if bad:
        assert "\n" not in note and f"line {bad[0]}" in note and f"{len(bad)} line" in note and str(path) in note
    else:
        assert note == ""
    src.to_end()
    assert src.cursor == len(good)
    check_state(src.state, src.now())
    assert replay(lines).applied == len(good)


@fuzz(300)
@given(values=st.lists(st.one_of(st.none(), ANY_FLOAT), max_size=40), seconds=st.one_of(st.none(), ANY_FLOAT),
       n=st.integers(-2**63, 2**63 - 1))
def test_the_panes_number_formats_take_any_number(values, seconds, n):
    from gkd_core import units
    from gkd_tui.widgets.format import fmt_bytes, sparkline

    line = sparkline(values, 30)
    assert len(line) <= 30 and "\n" not in line
    assert units.compact(seconds)
    assert fmt_bytes(n)
    if seconds is not None:
        assert units.spoken(seconds) and units.precise(seconds) and units.size(seconds)
