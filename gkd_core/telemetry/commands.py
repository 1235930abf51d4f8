"""The driver's command inbox: requests the supervisor forwards (cancel, dump_stacks).

The supervisor never waits on the driver: it forwards and answers its own client at once. The
driver carries a command out and puts the outcome on the record as an `action` event.
"""

from __future__ import annotations

import os
from typing import Any

import msgspec
import zmq


class Command(msgspec.Struct, kw_only=True):
    op: str
    args: dict[str, Any] = {}
    by: str = ""
    id: int = 0


_decoder = msgspec.json.Decoder(Command)


class CommandInbox:
    """A DEALER connected to the supervisor's driver socket (address from ``GKD_COMMANDS``)."""

    def __init__(self, address: str | None = None, ctx: zmq.Context | None = None):
        self.address = address if address is not None else os.environ.get("GKD_COMMANDS", "")
        self._sock: zmq.Socket | None = None
        if self.address:
            self._sock = (ctx or zmq.Context.instance()).socket(zmq.DEALER)
            self._sock.linger = 0
            self._sock.connect(self.address)
            self._sock.send(b"hello")

    def poll(self, timeout_s: float = 0.0) -> list[Command]:
        """The commands that arrived, waiting at most ``timeout_s`` for the first."""
        if self._sock is None:
            return []
        out: list[Command] = []
        if not self._sock.poll(int(timeout_s * 1000), zmq.POLLIN):
            return out
        while True:
            try:
                data = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return out
            try:
                out.append(_decoder.decode(data))
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # only the supervisor writes here; a bad frame is not worth a crash

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
