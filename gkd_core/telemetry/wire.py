"""The events' codec: bytes to a typed event and back, which never raises anything but ``Rejected``
(garbage, malformed, oversized, a newer version), and the count of what was rejected.

A reader's ``decode`` takes the fast typed path; the supervisor's ``decode_dict`` also keeps the raw
object, to stamp it and keep the fields of a newer writer.
"""

from __future__ import annotations

import collections
from typing import Any

import msgspec

from gkd_core.errors import GkdError
from gkd_core.telemetry.answers import answer_from
from gkd_core.telemetry.events import (
    ENVELOPE,
    INT64,
    KINDS,
    MAX_DEPTH,
    MAX_EVENT_BYTES,
    PROTOCOL_VERSION,
    ActionEvent,
    AnyEvent,
    Beat,
    Event,
    HeartbeatEvent,
    HeartbeatsEvent,
    UnknownEvent,
    beat_of_event,
)


class Rejected(GkdError):
    """Why a message was dropped: garbage, malformed, oversized, version."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_encoder = msgspec.json.Encoder()
_typed: msgspec.json.Decoder[Event] = msgspec.json.Decoder(AnyEvent)
_untyped = msgspec.json.Decoder()
_batch = msgspec.json.Decoder(HeartbeatsEvent)
_heartbeat = msgspec.json.Decoder(HeartbeatEvent)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def frames(event: Event) -> list[bytes]:
    """The ZeroMQ multipart form ``[kind, json]``."""
    return [event.kind.encode(), _encoder.encode(event)]


def validate_dict(obj: Any) -> Event | UnknownEvent:
    """Check an already-decoded object; raises ``Rejected`` with the reason."""
    if not isinstance(obj, dict):
        raise Rejected("malformed", f"an event is a JSON object, got {type(obj).__name__}")
    v = obj.setdefault("v", PROTOCOL_VERSION)  # a missing version reads as 1, as in the typed decoder
    if v != PROTOCOL_VERSION:
        raise Rejected("version", f"protocol version {v!r}, this reader speaks {PROTOCOL_VERSION}")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise Rejected("malformed", "no 'kind'")
    for key, typ in (("src", str), ("run", str)):
        if key in obj and not isinstance(obj[key], typ):
            raise Rejected("malformed", f"'{key}' must be a string")
    for key in ("ts", "seq"):
        if key in obj and (not isinstance(obj[key], (int, float)) or isinstance(obj[key], bool)):
            raise Rejected("malformed", f"'{key}' must be a number")
        if isinstance(obj.get(key), int) and not INT64[0] <= obj[key] <= INT64[1]:
            raise Rejected("malformed", f"'{key}' does not fit in 64 bits")  # (float() of it would raise)
    cls = KINDS.get(kind)
    if cls is None:
        rest = {k: val for k, val in obj.items() if k not in ENVELOPE}
        return UnknownEvent(kind=kind, seq=int(obj.get("seq", 0)), ts=float(obj.get("ts", 0.0)),
                            src=obj.get("src", ""), fields=rest)
    if cls is ActionEvent and not isinstance(obj.get("result"), str | None):  # an answer as an older writer wrote it
        obj["result"] = msgspec.to_builtins(answer_from(str(obj.get("op", "")), obj["result"]))
    try:
        event: Event = msgspec.convert(obj, AnyEvent)
    except msgspec.ValidationError as e:
        raise Rejected("malformed", f"{kind}: {e}") from None
    return event


def _depth_ok(obj: Any, left: int = MAX_DEPTH) -> bool:
    if isinstance(obj, dict):
        return left > 0 and all(_depth_ok(v, left - 1) for v in obj.values())
    if isinstance(obj, list):
        return left > 0 and all(_depth_ok(v, left - 1) for v in obj)
    return True


def _parse(data: bytes) -> Any:
    """Untyped JSON, nested at most MAX_DEPTH levels. msgspec recurses once a level, and so does every
    later encode of the event (the log, the subscribers, a snapshot): past Python's limit that raises
    RecursionError, which would end the supervisor's loop, at once or at the next snapshot."""
    try:
        obj = _untyped.decode(data)
    except msgspec.DecodeError as e:
        raise Rejected("garbage", f"not JSON ({e})") from None
    except RecursionError:
        raise Rejected("malformed", f"nested deeper than {MAX_DEPTH} levels") from None
    # (it cannot nest deeper than it has brackets: two scans in C spare most events the walk)
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH and not _depth_ok(obj):
        raise Rejected("malformed", f"nested deeper than {MAX_DEPTH} levels")
    return obj


def decode(data: bytes) -> Event | UnknownEvent:
    """Bytes -> event; raises ``Rejected`` (never anything else) for what must be dropped. (A reader's:
    what it reads was checked by the supervisor's ``decode_dict`` before it was logged or sent.)"""
    if len(data) > MAX_EVENT_BYTES:
        raise Rejected("oversized", f"{len(data)} bytes > {MAX_EVENT_BYTES}")
    try:
        ev = _typed.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        pass  # classify precisely on the slow path below
    else:
        if ev.v == PROTOCOL_VERSION:
            return ev
    return validate_dict(_parse(data))


def decode_dict(data: bytes) -> tuple[dict[str, Any], Event | UnknownEvent]:
    """For the supervisor: the raw object (to re-stamp and keep unknown fields) and the typed event."""
    if len(data) > MAX_EVENT_BYTES:
        raise Rejected("oversized", f"{len(data)} bytes > {MAX_EVENT_BYTES}")
    obj = _parse(data)
    try:
        typed = _typed.decode(data)  # the fast path: ~20x cheaper than msgspec.convert of the dict
    except (msgspec.ValidationError, msgspec.DecodeError):
        return obj, validate_dict(obj)  # the precise reason, or an unknown kind kept whole
    if typed.v != PROTOCOL_VERSION:
        return obj, validate_dict(obj)
    obj.setdefault("v", PROTOCOL_VERSION)
    return obj, typed


def decode_batch(data: bytes) -> HeartbeatsEvent | None:
    """A ``heartbeats`` batch, on the fast path (typed, no untyped parse: its shape bounds its depth,
    and fields it does not know are left out when it is encoded again); None when it is not a
    well-formed one, for ``decode_dict`` to say why."""
    if len(data) > MAX_EVENT_BYTES:
        return None
    try:
        e = _batch.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return e if e.v == PROTOCOL_VERSION else None


def beat_of(data: bytes) -> Beat | None:
    """A worker's encoded ``heartbeat`` event as a Beat (a relay's); None when it is not one."""
    try:
        e = _heartbeat.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    return beat_of_event(e) if e.v == PROTOCOL_VERSION else None


def decode_stampable(data: bytes) -> Event | None:
    """The typed event, when ``data`` is what ``encode`` writes of it, not yet stamped (``seq`` 0, no
    ``run``), with a ``ts``: the supervisor then stamps it and encodes it again, which writes the bytes
    ``decode_dict`` and ``encode_dict`` would have (no field of a newer writer to keep, none written
    otherwise, none nested deeper than they allow), at a third of their cost
    (tests/unit/test_stamped_events): a worker's phase changes, 20,000 a second in a step's burst at 65,536
    workers. None: anything else, for ``decode_dict``."""
    if len(data) > MAX_EVENT_BYTES or data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        return None  # (free-form fields, an alert's evidence, can nest: ``_parse`` bounds them)
    try:
        e = _typed.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if e.v != PROTOCOL_VERSION or e.seq or e.run or not e.ts or _encoder.encode(e) != data:
        return None
    return e


def encode_dict(obj: dict[str, Any]) -> bytes:
    return _encoder.encode(obj)


class RejectCounter:
    """Counts dropped messages by reason and remembers the last few, for alerts and `status`."""

    def __init__(self, keep: int = 5):
        self.counts: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[str] = collections.deque(maxlen=keep)

    def add(self, rejected: Rejected, where: str = "") -> None:
        self.counts[rejected.reason] += 1
        self.recent.append(f"{where}{rejected.reason}: {rejected.detail[:200]}")

    @property
    def total(self) -> int:
        return sum(self.counts.values())
