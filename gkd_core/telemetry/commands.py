"""A driver's side of the ops the supervisor hands it (``ops.Handed``: cancel, dump_stacks, pause, ...).

The supervisor never waits on the driver: it forwards a request and answers its own client at once with a
receipt. The driver carries the command out and its answer goes on the record as an ``action`` event carrying
the request's id, which whoever asked hears on the run's event stream. ``DriverCommands`` is that side once:
the inbox, each command's arguments parsed and handed to the handler its driver declares for their type, a
refusal for an op it does not carry out, and a handler's failure answered, never the driver's end. Our
trainer's driver, a watched job's driver and the demo driver each declare their handlers.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import AnyAnswer


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
        """The commands that arrived, waiting at most ``timeout_s`` for the first (the whole of it when there is no
        supervisor to hear from: a loop that serves its commands must not spin)."""
        if self._sock is None:
            time.sleep(timeout_s)
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


class Reply:
    """The answer to one command, whenever it comes (at once, or when a sync it cancels has ended): an
    ``action`` event with the request's id."""

    def __init__(self, cmd: Command, emit: Callable[[ev.Event], None]):
        self.cmd, self._emit = cmd, emit

    @property
    def by(self) -> str:
        return self.cmd.by

    def __call__(self, ok: bool, result: AnyAnswer | str) -> None:
        self._emit(ev.ActionEvent(op=self.cmd.op, by=self.cmd.by, ok=ok, result=result, request=self.cmd.id))


# a handler: the op's arguments (its own Struct) and the reply, which it answers now or later
Handler = Callable[[Any, Reply], None]


class DriverCommands:
    """The commands a driver carries out, dispatched by their arguments' type (``handlers``)."""

    who = "this driver"  # (in a refusal: "this driver does not carry out 'restart'")
    POLL_S = 0.2  # a thread of its own (``serve_in_thread``) looks this often

    def __init__(self, inbox: CommandInbox, emit: Callable[[ev.Event], None]):
        self.inbox, self.emit = inbox, emit

    def handlers(self) -> dict[type[ops.Args], Handler]:
        """Each op this driver carries out: its arguments' type -> the method that does."""
        return {}

    def serve_for(self, timeout_s: float = 0.0) -> None:
        """The commands that come within ``timeout_s``, carried out (called from the driver's own waits)."""
        for cmd in self.inbox.poll(timeout_s):
            self.carry_out(cmd)

    def serve_in_thread(self, name: str = "gkd-commands") -> threading.Thread:
        """Served on a thread of its own, for the driver's life (a job that is not ours: it never calls us)."""
        def serve() -> None:
            while True:
                self.serve_for(self.POLL_S)
        thread = threading.Thread(target=serve, name=name, daemon=True)
        thread.start()
        return thread

    def carry_out(self, cmd: Command) -> None:
        reply = Reply(cmd, self.emit)
        if cmd.op not in ops.OPS:
            reply(False, f"{self.who} does not know the op '{cmd.op[:40]}'")
            return
        try:
            args = ops.parse(cmd.op, cmd.args)  # (the supervisor forwards only what it parsed: a newer op, say)
            handler = self.handlers().get(type(args))
            if handler is None:
                reply(False, f"{self.who} does not carry out '{cmd.op}'")
                return
            handler(args, reply)
        except Exception as e:  # a command must never take the run down: the asker is told what it raised
            reply(False, f"{type(e).__name__}: {e}"[:300])
