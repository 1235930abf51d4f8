"""The control channel's requests: how one request is answered.

The supervisor owns the ops' handlers (``Supervisor._ops``); their arguments are declared in
``telemetry/ops``. This module hands a request's arguments, parsed, to its handler and turns its answer,
refusal or failure into one reply line and one ``action`` event carrying the request's id;
a client's retry of a request that acts is answered from ``RecentReplies``, once acted on, once recorded.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

import msgspec
import zmq

from gkd_core import config as config_mod
from gkd_core.errors import Refused as Refused  # (gkd's one refusal, gkd_core/errors.py)
from gkd_core.telemetry import control, ops
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import Noted

log = logging.getLogger("gkd.supervisor")


class Asked(msgspec.Struct, frozen=True):
    """Who asked, and the request's id: an outcome that comes later (a driver's) carries the id back."""

    by: str
    id: int = 0


# an op's handler: its arguments, who asked -> its answer. The arguments are the op's own Struct
# (``ops.OPS[op]``, which ``ops.parse`` made), so each handler takes its op's type, not ``ops.Args``.
Handler = Callable[[Any, Asked], Any]

def note(args: ops.NoteArgs, asked: Asked) -> Noted:
    """A person's note on the run ("lowered the micro-batch, no change"): on the record as an action, which
    the bug report lists among what was tried."""
    return Noted(note=args.text)


NAMES_SHOWN = 12  # workers listed in a refusal (a run of 65,536 has them all in the dashboard)


def check_targets(op: str, targets: list[str], workers: Collection[str]) -> None:
    """Refused, naming the first target that is neither a worker of the run nor a word the op knows,
    and listing the workers there are: a request for nobody is not forwarded as if it were done."""
    for t in targets:
        if t not in workers and t not in ops.NOT_WORKERS.get(op, ()):
            names = sorted(workers)
            more = f" (and {len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
            also = "".join(f", or '{w}'" for w in ops.NOT_WORKERS.get(op, ()) if w not in workers)
            raise Refused(f"{op}: no worker {t[:60]!r} in this run; its workers: "
                          f"{', '.join(names[:NAMES_SHOWN]) or 'none yet'}{more}{also}")


RECENT_REPLIES = 512  # acting requests remembered: far more than any client sends within its retries


class RecentReplies:
    """The answers to the latest requests that act, by id: a bounded memory, the oldest forgotten first.

    A client that hears nothing within its deadline sends the same request again, with the same id
    (``telemetry/control.py``): the supervisor may well have acted on the first try and only been late to
    answer (busy, or frozen for a moment). The repeat gets the first answer, and nothing is done or
    recorded again. The supervisor's loop reads a request only once it has answered the one before, so a
    repeat never arrives while the first is still being handled: it finds the first answer here.
    A repeat is the same id with the same bytes: two clients whose ids met by chance are two requests.
    """

    def __init__(self, size: int = RECENT_REPLIES):
        self.size = size
        self.repeats = 0  # repeats answered from memory (the supervisor's snapshot says how many)
        self._replies: OrderedDict[tuple[int, bytes], bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._replies)

    @staticmethod
    def _key(req_id: int, body: bytes) -> tuple[int, bytes]:
        return req_id, hashlib.blake2b(body, digest_size=16).digest()

    def answer(self, req_id: int, body: bytes) -> bytes | None:
        """The reply the first request with this id and body got; None when it is not a repeat."""
        key = self._key(req_id, body)
        reply = self._replies.get(key)
        if reply is not None:
            self._replies.move_to_end(key)
            self.repeats += 1
        return reply

    def remember(self, req_id: int, body: bytes, reply: bytes) -> None:
        """Keep ``reply`` for the request; a request without an id (0, an old client's) cannot be told
        from its repeats and is not kept."""
        if req_id == 0:
            return
        key = self._key(req_id, body)
        self._replies[key] = reply
        self._replies.move_to_end(key)
        while len(self._replies) > self.size:
            self._replies.popitem(last=False)


def serve(sock: zmq.Socket, via: str, handlers: dict[str, Handler],
          emit: Callable[[ev.Event], None], recent: RecentReplies) -> None:
    """The requests waiting on ``sock`` (100 at most, so the loop moves on): each checked, handed to its op,
    answered in one line, and each action recorded (queries are not); a refusal is answered and recorded
    too, and an op's bug is refused, never the supervisor's end. A repeat of a request that acts (the same
    id, a client's retry) is answered with the first answer from ``recent``: not acted on, not recorded."""
    for _ in range(100):
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        ident, envelope, body = frames[0], frames[1:-1], frames[-1]
        if len(frames) < 2:
            continue
        try:
            req = control.decode_request(body)
        except ValueError as e:
            sock.send_multipart([ident, *envelope, control.encode_reply(False, error=str(e))])
            emit(ev.ActionEvent(op="invalid", by=via, ok=False, result=str(e)[:300]))
            continue
        acts = req.op not in ops.QUERIES
        if acts and (first := recent.answer(req.id, body)) is not None:
            sock.send_multipart([ident, *envelope, first])
            continue
        reply, action = _handle(req, via, handlers)
        if acts:
            recent.remember(req.id, body, reply)  # before the next request is read: see RecentReplies
        sock.send_multipart([ident, *envelope, reply])
        if action is not None:
            emit(action)


def _handle(req: control.Request, via: str, handlers: dict[str, Handler]) -> tuple[bytes, ev.ActionEvent | None]:
    """One request carried out: its reply line, and its action event (None for a query answered), which
    carries the request's id."""
    by = f"{req.by[:80] or 'anonymous'} via {via}"
    handler = handlers.get(req.op)

    def refused(err: str) -> tuple[bytes, ev.ActionEvent]:
        return _refusal(req, err), ev.ActionEvent(op=req.op[:40], by=by, ok=False, result=err[:500], request=req.id)

    if handler is None or req.op not in ops.OPS:
        return refused(f"unknown op {req.op[:40]!r}; this supervisor answers {', '.join(handlers)}")
    try:
        result = handler(ops.parse(req.op, req.args), Asked(by, req.id))
    except (Refused, ops.BadArgs, config_mod.ConfigError) as e:
        return refused(str(e))
    except Exception as e:  # a bug of ours: refused and on the record, never the supervisor's death
        log.exception("control op %s", req.op)
        return refused(f"{req.op}: internal error, {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    if isinstance(result, msgspec.Raw):
        reply = b'{"ok":true,"error":"","id":%d,"result":%s}' % (req.id, bytes(result))
    else:
        reply = control.encode_reply(True, result, req_id=req.id)
    if req.op in ops.QUERIES:
        return reply, None  # queries are not actions; everything else is recorded
    return reply, ev.ActionEvent(op=req.op, by=by, ok=True, result=result, request=req.id)


def _refusal(req: control.Request, error: str) -> bytes:
    return control.encode_reply(False, error=error, req_id=req.id)
