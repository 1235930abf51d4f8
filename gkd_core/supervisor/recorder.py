"""Every event's way into the run: stamped with ``seq`` and ``run``, appended to ``events.jsonl``,
published, and folded into the RunState, in that order.

Workers' events come in through ``drain`` (the ingest's hot path); the supervisor's own through
``emit``. Heartbeats are thinned for the log (``runlog.heartbeats``): each is published and applied, the
log keeps the ones that say something new, and a node's batch of them is one message throughout.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec
import zmq

from gkd_core.runlog.eventlog import EventLog
from gkd_core.runlog.heartbeats import HeartbeatLog
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire

INGEST_BATCH = 5000  # messages taken at one go, so the loop answers control requests in between
BEATS_PER_LINE = 4096  # beats kept from batches are written up to this many to a line
# batches in a row are taken as one event of up to this many beats, full or ``same`` (about 100 KB: far from
# MAX_EVENT_BYTES, past which a subscriber would drop it)
BEATS_PER_MESSAGE = 1024
_NOBLOCK = int(zmq.NOBLOCK)
_KINDS = {kind: kind.encode() for kind in ev.KINDS}


def _kind_bytes(kind: str) -> bytes:
    return _KINDS.get(kind) or kind.encode()


def merged(batches: list[ev.HeartbeatsEvent]) -> ev.HeartbeatsEvent:
    """Nodes' batches of heartbeats that came in a row, as one event of the supervisor's (one alone stays its
    relay's)."""
    if len(batches) == 1:
        return batches[0]
    return ev.HeartbeatsEvent(src="supervisor", ts=max(b.ts for b in batches),
                              beats=[b for batch in batches for b in batch.beats],
                              clocks=[c for batch in batches for c in batch.clocks])


class Recorder:
    def __init__(self, run_id: str, state: RunState, log: EventLog, heartbeats: HeartbeatLog,
                 publish: Callable[[bytes, bytes], None], seq: int = 0):
        self.run_id, self.state, self.log, self.heartbeats, self.publish = run_id, state, log, heartbeats, publish
        self.seq = seq
        self.rejects = wire.RejectCounter()
        self._beats_kept: list[ev.Beat] = []  # beats of batches the log keeps, not yet written (`_take_batches`)
        self._clocks_kept: list[ev.RelayClock] = []  # and their relays' clocks
        self._beats_seq = 0
        # each alert as it is recorded (the notifier: supervisor/unattended), called on the loop; None: nobody
        self.on_alert: Callable[[ev.AlertEvent], None] | None = None

    def commit(self, obj: dict, typed: ev.Event | ev.UnknownEvent, kind: bytes, logged: bool = True) -> None:
        self.seq += 1
        obj["seq"] = self.seq
        obj["run"] = self.run_id
        ts = obj.get("ts") or time.time()
        obj["ts"] = ts
        typed.seq, typed.ts = self.seq, ts
        if isinstance(typed, ev.Event):
            typed.run = self.run_id
        self._record(wire.encode_dict(obj), typed, kind, logged)

    def commit_stamped(self, typed: ev.Event, logged: bool = True) -> None:
        """A worker's event as its sender encoded it (``wire.decode_stampable``), stamped."""
        self.seq += 1
        typed.seq, typed.run = self.seq, self.run_id
        self._record(wire.encode(typed), typed, _kind_bytes(typed.kind), logged)

    def _record(self, line: bytes, typed: ev.Event | ev.UnknownEvent, kind: bytes, logged: bool) -> None:
        if logged:
            if self._beats_kept or self._clocks_kept:
                self._write_beats()  # the log stays in seq order
            self.log.append(line, typed.ts)
        self.publish(kind, line)
        self.state.apply(typed)
        if self.on_alert is not None and type(typed) is ev.AlertEvent:
            self.on_alert(typed)

    def emit(self, event: ev.Event) -> None:
        """An event of the supervisor's own (src defaults to ``supervisor``)."""
        event.src = event.src or "supervisor"
        event.ts = event.ts or time.time()
        obj = msgspec.to_builtins(event)
        obj["kind"] = event.__struct_config__.tag
        self.commit(obj, event, obj["kind"].encode())

    def drain(self, sock: zmq.Socket, most: int = INGEST_BATCH) -> int:
        """The events waiting on ``sock``, up to ``most``; what cannot be read is counted by reason.
        Batches of heartbeats that arrive one after the other are taken as one (``_take_batches``).
        Returns how many messages it read (``most``: there may be more)."""
        # the hot path, at 65,536 workers 8,192 batches a second and 20,000 phase changes in a burst: frames
        # read until there is none (an option read per message, to ask first, costs more than the one
        # zmq.Again at the end); a message is [json] or [kind, json]
        recv = sock.recv
        batches: list[ev.HeartbeatsEvent] = []  # in a row, not taken yet: nothing else came between
        beats = 0  # in them
        try:
            for read in range(most):
                try:
                    frame = recv(_NOBLOCK, copy=False)
                except zmq.Again:
                    return read
                n, first = 1, frame.bytes
                data = first
                while frame.more:
                    frame = recv(_NOBLOCK, copy=False)
                    data = frame.bytes
                    n += 1
                batch = wire.decode_batch(data) if n == 2 and first == b"heartbeats" else None  # the fast path
                obj: dict | None = None
                typed: ev.Event | ev.UnknownEvent | None = None
                if batch is None:
                    typed = wire.decode_stampable(data) if n <= 2 else None  # the other: one encode, no parse
                    if typed is None:
                        try:
                            if n > 2:
                                raise wire.Rejected("malformed", f"{n} frames; an event is [json] or [kind, json]")
                            obj, typed = wire.decode_dict(data)
                        except wire.Rejected as r:
                            self.rejects.add(r, "ingest ")
                            continue
                    if type(typed) is ev.HeartbeatsEvent:  # (one the fast path could not take: written otherwise)
                        batch = typed
                if batch is not None:
                    size = len(batch.beats) + len(batch.clocks)
                    if beats + size > BEATS_PER_MESSAGE and batches:
                        taken, batches, beats = batches, [], 0
                        self._take_batches(taken)
                    batches.append(batch)
                    beats += size
                    continue
                assert typed is not None
                if batches:  # the order they came in: the batches before this event
                    taken, batches, beats = batches, [], 0
                    self._take_batches(taken)
                logged = True
                if type(typed) is ev.HeartbeatEvent:  # (the log's policy keeps beats: runlog.heartbeats)
                    logged, before = self.heartbeats.admit(ev.beat_of_event(typed))
                    if before is not None:
                        self.emit(ev.event_of_beat(before))
                if obj is None:
                    assert isinstance(typed, ev.Event)  # (decode_stampable's)
                    self.commit_stamped(typed, logged)
                else:
                    self.commit(obj, typed, _kind_bytes(typed.kind), logged)
            return most
        finally:
            if batches:
                self._take_batches(batches)

    def _take_batches(self, batches: list[ev.HeartbeatsEvent]) -> None:
        """Nodes' heartbeats that came in a row, as one ``heartbeats`` event: stamped, published and applied
        whole (at 65,536 workers, 8,192 batches a second become a few dozen messages to the subscribers);
        one batch alone stays the relay's. The log keeps the beats the single form would keep
        (``runlog.heartbeats``), gathered across batches into one ``heartbeats`` line of the supervisor's,
        written before the next line of any other kind (or at the next flush), under the seq of the newest
        batch it holds."""
        e = merged(batches)
        self.seq += 1
        e.seq, e.run = self.seq, self.run_id
        if not e.ts:
            e.ts = time.time()
        self.publish(b"heartbeats", wire.encode(e))
        if (len(self._beats_kept) + 2 * len(e.beats) + len(self._clocks_kept) + len(e.clocks) > BEATS_PER_LINE
                and (self._beats_kept or self._clocks_kept)):
            self._write_beats()  # (a full beat may bring the one held before it)
        n = len(self._beats_kept) + len(self._clocks_kept)
        self.heartbeats.admit_all(e.beats, self._beats_kept, clocked=bool(e.clocks))
        if e.clocks:
            for c in e.clocks:
                for src, _ in c.quiet:  # its last numbers, in the line before its quiet time (the reducer's order)
                    if (held := self.heartbeats.quiet(src)) is not None:
                        self._beats_kept.append(held)
            self.heartbeats.clocks.admit(e.clocks, self._clocks_kept)
        if len(self._beats_kept) + len(self._clocks_kept) > n:
            self._beats_seq = self.seq  # the line's seq: the newest batch it holds beats of
        self.state.apply(e)

    def _write_beats(self) -> None:
        beats, clocks, self._beats_kept, self._clocks_kept = self._beats_kept, self._clocks_kept, [], []
        ts = max(max((b.ts for b in beats), default=0.0), max((c.ts for c in clocks), default=0.0))
        self.log.append(wire.encode(ev.HeartbeatsEvent(seq=self._beats_seq, run=self.run_id, src="supervisor",
                                                     ts=ts, beats=beats, clocks=clocks)), ts)

    def restate_silent(self, everyone: bool = False) -> None:
        """Log the newest heartbeat of each worker that fell silent since, and the newest clock of each relay
        that did (see runlog.heartbeats); of every worker and relay with ``everyone`` (the run's end)."""
        for e in self.heartbeats.held() if everyone else self.heartbeats.silent():
            self.emit(ev.event_of_beat(e))
        clocks = self.heartbeats.clocks.silent(float("inf") if everyone else None)  # (relays fallen silent)
        if clocks:
            self.emit(ev.HeartbeatsEvent(ts=max(c.ts for c in clocks), clocks=clocks))

    def flush(self) -> None:
        if self._beats_kept or self._clocks_kept:
            self._write_beats()
        self.log.flush()

    def close(self) -> None:
        if self._beats_kept or self._clocks_kept:
            self._write_beats()
        self.log.close()
