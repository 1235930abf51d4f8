"""The strategies of the fuzz tests (tests/unit/test_fuzz.py in-process, tests/process/test_fuzz_processes.py
over real sockets): what a stranger, a bug or a torn disk can hand each part that reads input."""

from __future__ import annotations

import json
import math
import tempfile
import typing
from pathlib import Path

import msgspec
import zmq
from conftest import ROOT
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st

from gkd_core import config as config_mod
from gkd_core import diagnosis
from gkd_core.diagnosis import plan
from gkd_core.state import RunState, decode_state, encode_state
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_tui.render_text import status_text

RECORDING = ROOT / "screenshots" / "hang_demo.events.jsonl"


NOW = 1795385400.0  # inside the recording's time span


def fuzz(n: int, **kw):
    """A fixed seed and a bounded count: the same examples on every run."""
    return settings(derandomize=True, database=None, max_examples=n, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large], **kw)


# beyond 64 bits, and beyond what a float holds (int * float raises OverflowError there)
BIG_INTS = st.one_of(st.sampled_from([2**63, -2**63 - 1, 2**64, 10**309, -10**309, 10**400]),
                     st.integers(min_value=2**63, max_value=10**400),
                     st.integers(min_value=-10**400, max_value=-2**63 - 1))


EXTREME_FLOATS = st.sampled_from([1.7976931348623157e308, -1.7976931348623157e308, 5e-324, -5e-324, 0.0, -0.0, 1e300,
                                  -1e300, 1e-300])


ODD_TEXT = st.sampled_from(["", "²", "rollout/²", "rollout/٣", "rollout/" + "9" * 5000, "student/-1", "a/b/c",
                            "\x00", "line\nbreak", "\u202e", "x" * 5000, "../../../etc", "driver", "rollout/0",
                            "teacher/proxy"])


SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), BIG_INTS,
                    st.floats(allow_nan=False, allow_infinity=False), EXTREME_FLOATS, st.text(max_size=12), ODD_TEXT)


JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)


TS = st.one_of(st.floats(min_value=NOW - 600, max_value=NOW + 600), EXTREME_FLOATS, st.integers(-10, 10))


def _typed(t, hostile: bool = True) -> st.SearchStrategy:
    """Values of the right JSON type for a field of type ``t``, extreme ones included (with
    ``hostile``, integers beyond 64 bits too)."""
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is int:  # mostly in range, so that most events reach the reducer
        small = st.integers(-3, 70)
        return st.one_of(small, small, small, st.integers(-2**63, 2**63 - 1), *([BIG_INTS] if hostile else []))
    if t is float:
        return st.one_of(st.floats(-5, 1e4, allow_nan=False), TS, st.floats(allow_nan=False, allow_infinity=False))
    if t is str:
        return st.one_of(ODD_TEXT, st.text(max_size=16), st.sampled_from(
            ["started", "progress", "done", "timed_out", "running", "failed", "client", "server", "warn", "critical",
             "sync_weights", "generate", "straggler", "heartbeat_stale", "ALIVE", "DEAD", "nvml", "out of memory"]))
    if t is bool:
        return st.booleans()
    if t is typing.Any:
        return JSON_VALUES
    if origin is list:
        return st.lists(_typed(args[0], hostile), max_size=4)
    if origin is tuple and args[-1] is Ellipsis:  # (a relay clock's ``joined`` and ``quiet``)
        return st.lists(_typed(args[0], hostile), max_size=4)
    if origin is tuple:  # (a clock's ``quiet``: [src, ts] each)
        return st.tuples(*[_typed(a, hostile) for a in args]).map(list)
    if origin is dict:  # the keys the code reads among them (an alert's evidence: elapsed_s, verdict)
        keys = st.one_of(ODD_TEXT, st.text(max_size=6), st.sampled_from(["elapsed_s", "verdict", "where", "phase",
                                                                        "p50", "p95", "CPU", "GPU"]))
        return st.dictionaries(keys, _typed(args[1], hostile), max_size=4)
    if origin is typing.Union or type(t).__name__ == "UnionType":
        return st.one_of(*[st.none() if a is type(None) else _typed(a, hostile) for a in args
                           if a is not msgspec.UnsetType])
    if isinstance(t, type) and issubclass(t, msgspec.Struct):  # (a batch's beats: arrays on the wire)
        hints = typing.get_type_hints(t)
        parts = [_typed(hints[f.name], hostile) for f in msgspec.structs.fields(t)]
        if t.__struct_config__.array_like:
            return st.tuples(*parts).map(list)
        return st.fixed_dictionaries({f.name: p for f, p in zip(msgspec.structs.fields(t), parts, strict=True)})
    return JSON_VALUES


# a few workers, so that events meet in the same rows; the odd names among them
WORKERS = st.sampled_from(["driver", "student/0", "rollout/0", "rollout/1", "teacher/proxy", "agent/n0"])


SRC = st.one_of(WORKERS, WORKERS, ODD_TEXT, st.text(max_size=8))


# the values the code branches on, beside anything else of the same type
DOMAIN = {
    "code": st.sampled_from(diagnosis.CODES + ("ingest_rejected", "bad_step", "disk_low")),
    "state": st.sampled_from(["starting", "running", "restarting", "finished", "failed", "stopped", "started",
                              "progress", "done", "timed_out", "cancelled", "ALIVE", "DEAD", "PENDING_CREATION"]),
    "phase": st.sampled_from(["init", "load_data", "generate", "teacher_wait", "train", "sync_weights", "idle",
                              "finished", "failed", "cancelled", "exited"]),
    "side": st.sampled_from(["client", "server"]),
    "severity": st.sampled_from(["info", "warn", "critical"]),
    "target": WORKERS, "targets": st.lists(WORKERS, max_size=3), "pending": st.lists(WORKERS, max_size=3),
    "done": st.lists(WORKERS, max_size=3), "level": st.sampled_from(["info", "warn", "error"]),
    "probe": st.sampled_from(["nvml", "nvidia-smi"]), "op": st.sampled_from(["dump_stacks", "cancel", "restart"]),
    # what the diagnosis reads back from an alert of the same name, of any type
    "evidence": st.fixed_dictionaries({}, optional={k: SCALARS for k in ("elapsed_s", "verdict", "where", "phase")}),
}


def _fields(hostile: bool) -> dict[str, list[tuple[str, bool, st.SearchStrategy]]]:
    """Per kind: (field, required, values) for its payload fields (built once: building strategies
    costs more than drawing from them)."""
    out = {}
    for kind, cls in ev.KINDS.items():
        hints = typing.get_type_hints(cls)
        out[kind] = [(f.name, f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT,
                      st.one_of(DOMAIN[f.name], _typed(hints[f.name], hostile)) if f.name in DOMAIN
                      else _typed(hints[f.name], hostile))
                     for f in msgspec.structs.fields(cls) if f.name not in ev.ENVELOPE]
    return out


FIELDS = {hostile: _fields(hostile) for hostile in (False, True)}


@st.composite
def event_objects(draw, hostile: bool = True, kinds=tuple(ev.KINDS)) -> dict:
    """An event as a JSON object: well-typed with extreme values (so that it reaches the reducer),
    an unknown kind or an unknown field; with ``hostile``, sometimes a field of the wrong type and
    integers beyond 64 bits."""
    kind = draw(st.sampled_from(kinds + ("zzz_future_kind",)))
    obj: dict = {"kind": kind, "v": 1, "src": draw(SRC), "ts": draw(TS)}
    for name, required, values in FIELDS[hostile].get(kind, []):
        if required or draw(st.booleans()):
            wrong = hostile and draw(st.integers(0, 39)) == 0
            obj[name] = draw(JSON_VALUES if wrong else values)
    if draw(st.integers(0, 9)) == 0:
        obj[draw(st.text(min_size=1, max_size=6))] = draw(JSON_VALUES)
    return obj


def encode(obj) -> bytes:
    return msgspec.json.encode(obj)


def check_state(state: RunState, now: float) -> None:
    """What the supervisor and every dashboard do with a state: must not raise."""
    found = diagnosis.diagnose(state, now, diagnosis.Settings(stall_s=10.0, heartbeat_s=1.0))
    # the rules' own findings against alerts that came from elsewhere, under the same names
    found += [ev.AlertEvent(code=a.code, targets=list(a.targets), severity=a.severity, message="m",
                            evidence={"elapsed_s": 30.0, "verdict": "stuck"}) for a in state.alerts.values()]
    for a in diagnosis.changes(state, found):
        state.apply(a)
    diagnosis.AutoStacks().due(state, 100.0)
    plan.restart_plan(state, config_mod.load_config(None))
    status_text(state, now, Path("RUN"))
    state.sync_view(now)
    state.teacher_totals()
    state.teacher_rate()
    state.hung_probes(now)
    assert decode_state(encode_state(state)) == state  # a snapshot reads back as the same state


def nested(depth: int, kind: bytes = b"log") -> bytes:
    """An event with arrays ``depth`` deep in it (msgspec recurses once a level)."""
    return b'{"v":1,"kind":"' + kind + b'","x":' + b"[" * depth + b"]" * depth + b"}"


DEEP = st.sampled_from([40, 1000, 5000, 100_000]).map(nested)  # what the supervisor refuses (at most 32)


TOO_DEEP = st.sampled_from([5000, 100_000]).map(nested)  # what no reader can take (Python's recursion)


def _leaf_keys(cls=config_mod.Config, prefix="") -> list[tuple[str, object]]:
    """(dotted key, type) of every value in the config schema."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in msgspec.structs.fields(cls):
        t = hints[f.name]
        if isinstance(t, type) and issubclass(t, msgspec.Struct):
            out += _leaf_keys(t, f"{prefix}{f.name}.")
        else:
            out.append((f"{prefix}{f.name}", t))
    return out


CONFIG_KEYS = _leaf_keys()


NUMBERS = st.one_of(st.integers(-5, 5), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e308, -1e308,
                                                          2**63, 2**64, 10**30, -10**30, 0, -1, 0.0, -0.5]),
                    st.floats(), BIG_INTS)


CONFIG_VALUES = st.one_of(NUMBERS, NUMBERS, JSON_VALUES, st.sampled_from(
    ["", "yes", "on", "~", "2001-02-30", "0x1F", "1_000", ".nan", "[", "{a: 1}", "!!python/none", "9" * 5000]))


def check_loaded(cfg: config_mod.Config) -> None:
    """A config that loads is one the supervisor can write out and read back, with no number that is
    not a finite float or a 64-bit integer."""
    tree = msgspec.to_builtins(cfg)

    def numbers(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from numbers(v)
        elif isinstance(x, list):
            for v in x:
                yield from numbers(v)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            yield x
    for n in numbers(tree):
        assert (math.isfinite(n) if isinstance(n, float) else -2**63 <= n < 2**63), n
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.yaml"
        path.write_text(config_mod.to_yaml(cfg))
        assert config_mod.load_config(path) == cfg
    config_mod.digest(cfg)


def check_refused(e: config_mod.ConfigError, *names: str) -> None:
    msg = str(e)
    assert msg and "\n" not in msg, msg  # one line
    assert len(msg) < 2000, msg[:300]
    assert any(n in msg for n in names), (names, msg[:300])  # says where


EXAMPLE_YAML = (ROOT / "examples" / "tiny_cpu.yaml").read_bytes()


@st.composite
def torn_yaml(draw) -> bytes:
    """The example config cut, spliced with garbage, or garbage alone (binary included)."""
    how = draw(st.sampled_from(["cut", "insert", "replace", "text", "binary", "nested"]))
    if how == "text":
        return draw(st.text(max_size=200)).encode()
    if how == "binary":
        return draw(st.binary(max_size=200))
    if how == "nested":  # deep nesting and aliases: the parser's recursion, the loader's shared nodes
        depth = draw(st.integers(1, 3000))
        return draw(st.sampled_from([
            b"[" * depth, b"a: " + b"{b: " * depth, b"x: &a [1]\ny: [*a, *a, *a]\n",
            b"trainer: &t {total_steps: 5}\ndata: *t\n",
            b"model: !!python/object:os.system x\n", b"trainer:\n  total_steps: 2001-02-30\n",
            b"\xef\xbb\xbftrainer: {}\n", b"trainer: {total_steps: " + b"9" * 5000 + b"}\n"]))
    at = draw(st.integers(0, len(EXAMPLE_YAML)))
    if how == "cut":
        return EXAMPLE_YAML[:at]
    junk = draw(st.binary(min_size=1, max_size=20) | st.sampled_from([b":", b"- ", b"\t", b"  ", b"{", b"]", b"&a",
                                                                      b"*a", b"!!", b"%", b"\x00", b"'", b'"']))
    end = at if how == "insert" else min(len(EXAMPLE_YAML), at + draw(st.integers(1, 40)))
    return EXAMPLE_YAML[:at] + junk + EXAMPLE_YAML[end:]


# the start of a real run (run, worker, phase, heartbeat, sync, teacher events), cut to keep it quick
LOG_LINES = [line for line in RECORDING.read_bytes().split(b"\n") if line.strip()][:150]


def _wrong_typed(line: bytes, field: str, value) -> bytes:
    obj = json.loads(line)
    obj[field] = value
    return encode(obj)


@st.composite
def garbage_lines(draw) -> bytes:
    """A line that is no event, whatever the reader: never a newline inside (each is one line)."""
    line = draw(st.sampled_from(LOG_LINES))
    how = draw(st.sampled_from(["binary", "cut", "text", "non_object", "wrong_type", "huge_int", "version", "deep"]))
    if how == "binary":
        out = b"\xff" + draw(st.binary(max_size=60))  # 0xff starts no JSON value
    elif how == "deep":
        out = draw(TOO_DEEP)
    elif how == "cut":  # a line torn in the middle: a JSON object without its end
        out = line[:draw(st.integers(1, len(line) - 1))]
    elif how == "text":
        out = b"# " + draw(st.text(max_size=40)).encode()
    elif how == "non_object":
        out = encode(draw(st.one_of(st.lists(SCALARS, max_size=3), SCALARS)))
    elif how == "wrong_type":
        field, value = draw(st.sampled_from([("ts", "yesterday"), ("src", 7), ("kind", 5), ("kind", ""), ("run", []),
                                             ("seq", "1"), ("seq", True), ("ts", None)]))
        out = _wrong_typed(line, field, value)
    elif how == "huge_int":
        field = draw(st.sampled_from(["seq", "ts"]))  # ts is a float: an integer is refused past a float's range
        out = _wrong_typed(line, field, draw(BIG_INTS if field == "seq" else st.sampled_from([10**309, -10**400])))
    else:
        out = _wrong_typed(line, "v", draw(st.sampled_from([0, 2, 99])))
    return out.replace(b"\n", b" ").replace(b"\r", b"\r ")  # a stray CR is no line break for the reader


@st.composite
def torn_logs(draw) -> tuple[list[bytes], list[int]]:
    """(the file's lines, the 1-based numbers of those that are no event): a real log with garbage
    inserted and appended, two events out of order, and maybe its last line torn."""
    lines = list(LOG_LINES[:draw(st.integers(1, len(LOG_LINES)))])
    bad: set[int] = set()
    if draw(st.booleans()):  # the periods a replay fills the left-out heartbeats with, of any value
        any_float = st.floats(allow_nan=False, allow_infinity=False)
        obj = json.loads(lines[0])
        obj["heartbeat_s"] = draw(st.one_of(st.sampled_from([1.0, 0.2, 1e-9, 5e-324, -1.0, 0.0]), any_float))
        obj["heartbeat_log_s"] = draw(st.one_of(st.sampled_from([10.0, 5.0, 1e308, 0.0, -1.0]), any_float))
        lines[0] = encode(obj)
    if len(lines) > 2 and draw(st.booleans()):  # out of order (seq and ts): still events, kept in file order
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
    for _ in range(draw(st.integers(0, 6))):
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, draw(garbage_lines()))
        bad = {b + 1 if b >= at else b for b in bad} | {at}
    if draw(st.booleans()):  # torn last line: a crash in the middle of a write
        last = lines[-1]
        if len(last) > 1 and len(lines) - 1 not in bad:
            lines[-1] = last[:draw(st.integers(1, len(last) - 1))]
            bad.add(len(lines) - 1)
    if draw(st.booleans()):  # an empty line: no harm, and no warning
        at = draw(st.integers(0, len(lines)))
        lines.insert(at, b"")
        bad = {b + 1 if b >= at else b for b in bad}
    return lines, sorted(b + 1 for b in bad)


def write_log(folder: Path, lines: list[bytes]) -> Path:
    path = folder / "events.jsonl"
    path.write_bytes(b"\n".join(lines))
    return path


def torn_run(folder: Path, lines: list[bytes], endpoints: bytes | None) -> Path:
    """A run directory as a crash (or a stranger) leaves it: a torn log, maybe a damaged endpoints.json."""
    run = folder / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_mod.to_yaml(config_mod.load_config(None)))
    write_log(run, lines)
    if endpoints is not None:
        (run / "endpoints.json").write_bytes(endpoints)
    return run


DAMAGED_ENDPOINTS = [None, b"", b"\xff\xfe{", b"{\"control\": ", b"[1, 2]", b"null", b"{}",
                     b'{"control": 5, "events": []}', b'{"control": "foo", "events": "ipc://x"}',
                     b'{"control": "tcp://127.0.0.1:1", "events": "ipc://x"}']


ANY_FLOAT = st.one_of(st.floats(allow_nan=False, allow_infinity=False), EXTREME_FLOATS, st.floats())


# extremes that each broke a pane once, ahead of the fuzzed events: a loss of -1e308 then 1e308 (the
# sparkline's NaN), a sync with no timeout to speak of and an elapsed time that overflows, a rank no
# int() reads, a GPU of 2^63-1 bytes, a stack of binary garbage
EXTREMES = [
    {"kind": "run", "state": "running", "total_steps": 2**63 - 1, "heartbeat_s": 1e-300, "heartbeat_log_s": 1e300},
    {"kind": "worker", "src": "rollout/²", "pid": -1, "gpus": [2**63 - 1, -2**63]},
    {"kind": "metrics", "step": 1, "loss": -1.7976931348623157e308, "kl": 5e-324, "tokens_per_s": 1e308,
     "timing": {"train": 1e308, "sync": 1e308}, "grad_norm": 1e308, "completion_len": -1e308, "epoch": 1e308},
    {"kind": "metrics", "step": 2, "loss": 1.7976931348623157e308, "kl": -1e308, "agreement": 1e308},
    {"kind": "sync", "sync_id": 1, "state": "started", "timeout_s": 5e-324, "elapsed_s": 1.7976931348623157e308,
     "pending": ["rollout/²"]},
    {"kind": "gpu", "src": "agent/n0", "node": "n0", "index": 0, "util": 0.0, "mem_used": 2**63 - 1,
     "mem_total": 2**63 - 1, "temp": 1e308, "power": -1e308, "pids": [2**63 - 1]},
    {"kind": "teacher", "side": "client", "sent": 2**63 - 1, "completed": 2**63 - 1, "in_flight": -5,
     "latency_ms": {"p50": 1e308, "p95": -1e308}},
    {"kind": "teacher", "side": "client", "sent": 0, "completed": -2**63, "ts": 1.0},
    {"kind": "stack", "target": "rollout/²", "dump_id": "x", "method": "py-spy",
     "text": "Thread 1 (idle):\n    \x00\x1b[31m at ?? (??)\n" * 3},
    {"kind": "alert", "code": "straggler", "severity": "critical", "message": "\x1b[2J" * 3, "hint": "[bold]x[/",
     "targets": ["rollout/²"], "evidence": {"elapsed_s": "soon"}},
]


async def _drive(app, size) -> None:
    from gkd_tui.screens.stacks import StackScreen

    async with app.run_test(size=size) as pilot:
        await pilot.press("end")
        await pilot.pause()
        app.redraw()
        for key in ("down", "enter", "escape", "question_mark", "escape", "slash", "r", "o", "enter", "escape",
                    "home", "right", "right", "end"):
            await pilot.press(key)
        with app.source.lock:
            stacks = dict(app.source.state.stacks)
            named = frozenset(t for a in app.source.state.alerts.values() for t in a.targets)
        if stacks:  # the stack viewer, on whatever the stacks hold
            await app.push_screen(StackScreen(stacks, "x", named))
            await pilot.pause()
            await pilot.press("slash", "a", "enter", "escape", "escape")
        app.redraw()
        await pilot.pause()
        # the plots view, every tab, on whatever numbers the state holds
        await pilot.press("p")
        for key in ("2", "3", "4", "5", "1"):
            await pilot.press(key)
            await pilot.pause()
        await pilot.press("escape")


class RawDealer:
    """A DEALER that sends exactly the frames it is given (ControlClient would encode them properly)."""

    def __init__(self, address: str):
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(address)

    def ask(self, body: bytes, timeout_s: float = 5.0) -> dict:
        self.sock.send_multipart([b"", body])
        assert self.sock.poll(int(timeout_s * 1000)), f"no answer within {timeout_s} s to {body[:80]!r}"
        return msgspec.json.decode(self.sock.recv_multipart()[-1])

    def ping(self) -> None:
        reply = self.ask(encode({"op": "ping", "id": 1}))
        assert reply["ok"] and reply["result"]["answer"] == "ping", reply

    def close(self) -> None:
        self.sock.close()


def assert_refused(reply: dict, *words: str) -> None:
    """ok: false, with one line that says what and where."""
    assert reply["ok"] is False, reply
    err = reply["error"]
    assert err and "\n" not in err and len(err) < 1000, err
    for w in words:
        assert w in err, (w, err)


def assert_log_intact(run: Path, before: bytes) -> list[dict]:
    """Every line of events.jsonl an event, seq strictly increasing (a heartbeat the log thins out
    leaves a gap), and what was there before still there."""
    data = (run / "events.jsonl").read_bytes()
    assert data.startswith(before)
    lines = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]  # the last, maybe half-flushed line aside
    events = [wire.decode(line) for line in lines]  # raises on a line that is no event
    assert all(a.seq < b.seq for a, b in zip(events, events[1:], strict=False)) and events[0].seq == 1
    return [json.loads(line) for line in lines]


def alive(sup) -> None:
    """The supervisor still runs; else its last words."""
    if sup.proc.poll() is not None:
        raise AssertionError(f"the supervisor exited {sup.proc.returncode}: {sup.proc.stdout.read().decode()[-3000:]}")


def flushed(run: Path) -> bytes:
    data = (run / "events.jsonl").read_bytes()
    return data[:data.rfind(b"\n") + 1]


# the arguments of the ops that act, each with values that are not what it takes
NOT_BOOL = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.booleans(), max_size=2))


NOT_STRINGS = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.dictionaries(st.text(max_size=3), SCALARS),
                        st.lists(st.one_of(st.integers(), st.none(), st.lists(st.text())), min_size=1, max_size=3))


BAD_ARGS = {
    "stop": {"grace_s": st.one_of(st.text(max_size=8), st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
                                  st.integers(max_value=-1), st.floats(max_value=-0.001), st.floats(min_value=86401),
                                  BIG_INTS, st.sampled_from(["nan", "inf", "5"]))},
    "restart": {"shrink": NOT_BOOL, "dry_run": NOT_BOOL, "overrides": NOT_STRINGS},
    "cancel": {"target": st.one_of(st.none(), st.integers(), st.just(""), st.lists(st.text(), max_size=2)),
               "mode": st.one_of(st.none(), st.integers(), st.text(max_size=8).filter(
                   lambda m: m not in ("cooperative", "force"))),
               "pid": st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.integers(max_value=-1),
                                st.sampled_from([1.5, -0.5]))},
    "dump_stacks": {"targets": NOT_STRINGS,
                    "dump_id": st.one_of(st.none(), st.integers(), st.sampled_from(
                        ["", "../../../tmp/x", "a/b", ".hidden", "..", "x" * 65, "tab\there", "nul\x00"]))},
    "open_ingest": {"host": st.one_of(st.none(), st.integers(), st.booleans(), st.lists(st.text(), max_size=2))},
    "pause": {"for_s": st.one_of(st.none(), st.booleans(), st.text(max_size=8), st.just(0), st.floats(max_value=0),
                                 st.floats(min_value=604_801), BIG_INTS, st.sampled_from(["nan", "inf", "60"]))},
    "note": {"text": st.one_of(st.none(), st.integers(), st.just(""), st.just("x" * 2001),
                               st.lists(st.text(), max_size=2))},
}


VALID_ARGS = {"stop": {}, "restart": {"dry_run": True, "shrink": False, "overrides": []},
              "cancel": {"target": "sync", "mode": "cooperative"},
              "dump_stacks": {"targets": [], "dump_id": "fuzz"}, "open_ingest": {"host": "127.0.0.1"},
              "note": {"text": "tried a smaller micro-batch"}, "pause": {"for_s": 60.0}}


@st.composite
def bad_requests(draw) -> tuple[bytes, tuple[str, ...]]:
    """(a request that must be refused, words its error must hold)."""
    how = draw(st.sampled_from(["bytes", "torn", "non_object", "envelope", "deep", "unknown_op", "bad_arg",
                                "unknown_arg"]))
    if how == "bytes":
        return b"\xff" + draw(st.binary(max_size=100)), ("malformed",)
    if how == "deep":  # within 64 KiB, deeper than Python recurses
        depth = draw(st.sampled_from([5000, 30_000]))
        return b'{"op":"ping","args":{"a":' + b"[" * depth + b"]" * depth + b"}}", ("malformed", "nested")
    if how == "torn":
        whole = encode({"op": "stop", "args": {"grace_s": 1}})
        return whole[:draw(st.integers(0, len(whole) - 1))], ("malformed",)
    if how == "non_object":
        return encode(draw(st.one_of(SCALARS, st.lists(SCALARS, max_size=3)))), ("malformed",)
    if how == "envelope":  # a field of the envelope of the wrong type: the error says which
        field, value = draw(st.sampled_from([("op", 5), ("op", None), ("op", ["stop"]), ("args", "grace_s=0"),
                                             ("args", [1]), ("args", 3), ("id", "7"), ("id", 1.5),
                                             ("by", {"me": 1})]))
        req = {"op": "stop", "args": {}, field: value}
        return encode(req), ("malformed", f"$.{field}")
    if how == "unknown_op":
        op = draw(st.text(max_size=30).filter(lambda o: o not in control_ops()))
        return encode({"op": op, "args": draw(st.dictionaries(st.text(max_size=5), SCALARS, max_size=2))}), \
            ("unknown op",)
    op = draw(st.sampled_from(sorted(BAD_ARGS)))
    args = dict(VALID_ARGS[op])
    if how == "unknown_arg":
        name = draw(st.sampled_from(["dry-run", "force", "grace", "target ", "", "DryRun"]) | st.text(max_size=8))
        assume(name not in BAD_ARGS[op])
        args[name] = draw(SCALARS)
    else:
        name = draw(st.sampled_from(sorted(BAD_ARGS[op])))
        args[name] = draw(BAD_ARGS[op][name])
    return encode({"op": op, "args": args, "id": 9}), (op, repr(name)[1:-1][:40])


def control_ops() -> tuple[str, ...]:
    from gkd_core.telemetry.ops import OPS

    return tuple(OPS)


@st.composite
def bad_messages(draw) -> list[bytes]:
    """A multipart message every reader must drop (and the supervisor count)."""
    base = {"v": 1, "kind": "log", "src": "fuzz/bad", "message": "must not be logged"}
    how = draw(st.sampled_from(["frames", "bytes", "non_object", "envelope", "huge", "big_int", "version", "deep"]))
    if how == "deep":
        return [b"log", draw(DEEP)]
    if how == "frames":  # an event is [json] or [kind, json]
        return [b"log"] * draw(st.integers(2, 5)) + [encode(base)]
    if how == "bytes":
        return [b"log", b"\xff" + draw(st.binary(max_size=100))]
    if how == "non_object":
        return [encode(draw(st.one_of(SCALARS, st.lists(SCALARS, max_size=3))))]
    if how == "envelope":
        field, value = draw(st.sampled_from([("kind", 5), ("kind", ""), ("kind", None), ("src", 7), ("src", ["a"]),
                                             ("run", {}), ("ts", "now"), ("ts", True), ("seq", "1"), ("seq", None)]))
        return [b"log", encode(dict(base, **{field: value}))]
    if how == "huge":  # past the 1 MiB a message may have
        return [b"log", encode(dict(base, message="x" * ((1 << 20) + draw(st.integers(0, 1000)))))]
    if how == "big_int":  # an integer past 64 bits, where the reducer does float arithmetic with it
        kind, field = draw(st.sampled_from([("gpu", "mem_total"), ("gpu", "mem_used"), ("heartbeat", "rss"),
                                            ("teacher", "completed"), ("metrics", "step"), ("zzz", "seq")]))
        obj = {"v": 1, "kind": kind, "src": "fuzz/bad", "node": "n", "index": 0, "step": 1, field: draw(BIG_INTS)}
        return [kind.encode(), encode(obj)]
    return [b"log", encode(dict(base, v=draw(st.sampled_from([0, 2, "1", None]))))]
