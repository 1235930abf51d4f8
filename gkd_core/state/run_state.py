"""``RunState``: what the run is now (its fields: ``run_record``; its derived views: ``views``), folded from its
events by ``apply``, which hands each kind of event to its case in ``reducer``."""

from __future__ import annotations

import msgspec

from gkd_core.state.reducer import HANDLERS
from gkd_core.state.views import RunViews
from gkd_core.telemetry import events as ev


class RunState(RunViews):
    """The run's state: a msgspec Struct (one encoded object: a snapshot is ``encode_state``), no fields beyond
    ``RunRecord``'s."""

    def apply(self, e: ev.Event | ev.UnknownEvent) -> None:
        """Fold one event into the state. Never raises on a well-typed event."""
        if e.seq:
            self.last_seq = e.seq
        self.applied += 1
        if e.ts > self.last_ts:
            self.last_ts = e.ts
        handler = HANDLERS.get(type(e))
        if handler is None:
            self.unknown[e.kind] = self.unknown.get(e.kind, 0) + 1
            return
        handler(self, e)


_state_decoder = msgspec.json.Decoder(RunState)


def encode_state(state: RunState) -> bytes:
    return msgspec.json.encode(state)


def decode_state(data: bytes | str) -> RunState:
    return _state_decoder.decode(data)
