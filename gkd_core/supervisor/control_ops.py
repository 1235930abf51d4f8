"""The control channel's requests: what each op takes, and how one request is answered.

The supervisor owns the ops (``Supervisor._ops``); this module checks a request's arguments before an
op sees them and turns its answer, refusal or failure into one reply line and one ``action`` event;
a client's retry of a request that acts is answered from ``RecentReplies``, once acted on, once recorded.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

import msgspec
import zmq

from gkd_core import config as config_mod
from gkd_core.telemetry import control
from gkd_core.telemetry import events as ev

log = logging.getLogger("gkd.supervisor")


class Refused(Exception):
    """A control request that is understood but cannot be carried out; the message says why."""


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


# The arguments each op that acts takes, and what each must be. Anything else is refused before
# anything is done, naming the op and the argument: a typo (`dry-run`) must not be taken for a real
# restart, nor a string for a number deep in the loop, where it would take the supervisor down.
# (ping and snapshot only read, and ignore their arguments.)
_DUMP_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}")  # a folder under RUN/stacks, nowhere else
OP_ARGS: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "stop": {"grace_s": (lambda v: _number(v) and 0 <= v <= 86400, "a number of seconds from 0 to 86400")},
    "restart": {"shrink": (lambda v: isinstance(v, bool), "true or false"),
                "dry_run": (lambda v: isinstance(v, bool), "true or false"),
                "overrides": (_strings, "a list of key=value strings")},
    "cancel": {"target": (lambda v: isinstance(v, str) and 0 < len(v) <= 200, "a worker (rollout/1), 'sync' or 'all'"),
               "mode": (lambda v: v in ("cooperative", "force"), "'cooperative' or 'force'")},
    "dump_stacks": {"targets": (_strings, "a list of workers, e.g. [\"rollout/1\"] ([] for all)"),
                    "dump_id": (lambda v: isinstance(v, str) and _DUMP_ID.fullmatch(v) is not None,
                                "a name of at most 64 letters, digits, '.', '_' or '-'")},
    "open_ingest": {"host": (lambda v: isinstance(v, str), "an IP address, as text")},
}


# what an op may name besides the run's workers
# (the driver of a job that is not ours says nothing of itself until it calls ray.init: its stacks
# are still there to take)
NOT_WORKERS = {"cancel": ("sync", "all"), "dump_stacks": ("driver",)}
NAMES_SHOWN = 12  # workers listed in a refusal (a run of 65,536 has them all in the dashboard)


def check_targets(op: str, targets: list[str], workers: Collection[str]) -> None:
    """Refused, naming the first target that is neither a worker of the run nor a word the op knows,
    and listing the workers there are: a request for nobody is not forwarded as if it were done."""
    for t in targets:
        if t not in workers and t not in NOT_WORKERS.get(op, ()):
            names = sorted(workers)
            more = f" (and {len(names) - NAMES_SHOWN} more)" if len(names) > NAMES_SHOWN else ""
            also = "".join(f", or '{w}'" for w in NOT_WORKERS.get(op, ()) if w not in workers)
            raise Refused(f"{op}: no worker {t[:60]!r} in this run; its workers: "
                          f"{', '.join(names[:NAMES_SHOWN]) or 'none yet'}{more}{also}")


def check_args(op: str, args: dict) -> None:
    """Refused, naming the op and the argument, unless ``args`` are what ``op`` takes."""
    wanted = OP_ARGS.get(op)
    if wanted is None:
        return
    for name, value in args.items():
        if name not in wanted:
            takes = ", ".join(wanted) if wanted else "none"
            raise Refused(f"{op}: unknown argument {name[:40]!r}; it takes {takes}")
        ok, what = wanted[name]
        if not ok(value):
            shown = msgspec.json.encode(value)[:60].decode(errors="replace")
            raise Refused(f"{op}: argument {name!r} must be {what}, got {shown}")


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


def serve(sock: zmq.Socket, via: str, ops: dict[str, Callable[[dict, str], Any]],
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
        acts = req.op not in control.QUERIES
        if acts and (first := recent.answer(req.id, body)) is not None:
            sock.send_multipart([ident, *envelope, first])
            continue
        reply, action = _handle(req, via, ops)
        if acts:
            recent.remember(req.id, body, reply)  # before the next request is read: see RecentReplies
        sock.send_multipart([ident, *envelope, reply])
        if action is not None:
            emit(action)


def _handle(req: control.Request, via: str,
            ops: dict[str, Callable[[dict, str], Any]]) -> tuple[bytes, ev.ActionEvent | None]:
    """One request carried out: its reply line, and its action event (None for a query answered)."""
    by = f"{req.by[:80] or 'anonymous'} via {via}"
    handler = ops.get(req.op)
    if handler is None:
        err = f"unknown op {req.op[:40]!r}; this supervisor answers {', '.join(ops)}"
        return _refusal(req, err), ev.ActionEvent(op=req.op[:40], by=by, ok=False, result=err)
    try:
        check_args(req.op, req.args)
        result = handler(req.args, by)
    except (Refused, config_mod.ConfigError) as e:
        return _refusal(req, str(e)), ev.ActionEvent(op=req.op, by=by, ok=False, result=str(e)[:500])
    except Exception as e:  # a bug of ours: refused and on the record, never the supervisor's death
        log.exception("control op %s", req.op)
        err = f"{req.op}: internal error, {type(e).__name__}: {' '.join(str(e).split())[:300]}"
        return _refusal(req, err), ev.ActionEvent(op=req.op, by=by, ok=False, result=err)
    if isinstance(result, msgspec.Raw):
        reply = b'{"ok":true,"error":"","id":%d,"result":%s}' % (req.id, bytes(result))
    else:
        reply = control.encode_reply(True, result, req_id=req.id)
    if req.op in control.QUERIES:
        return reply, None  # queries are not actions; everything else is recorded
    return reply, ev.ActionEvent(op=req.op, by=by, ok=True, result=result)


def _refusal(req: control.Request, error: str) -> bytes:
    return control.encode_reply(False, error=error, req_id=req.id)
