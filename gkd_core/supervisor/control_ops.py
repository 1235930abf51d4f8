"""The control channel's requests: what each op takes, and how one request is answered.

The supervisor owns the ops (``Supervisor._ops``); this module checks a request's arguments before an
op sees them and turns its answer, refusal or failure into one reply line and one ``action`` event.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Collection

import msgspec
import zmq

from gkd_core import config as config_mod
from gkd_core.telemetry import control, events as ev

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


def serve(sock: zmq.Socket, via: str, ops: dict[str, Callable[[dict, str], Any]],
          emit: Callable[[ev.Event], None]) -> None:
    """The requests waiting on ``sock`` (100 at most, so the loop moves on): each checked, handed to its op,
    answered in one line, and each action recorded (queries are not); a refusal is answered and recorded
    too, and an op's bug is refused, never the supervisor's end."""
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
        by = f"{req.by[:80] or 'anonymous'} via {via}"
        handler = ops.get(req.op)
        if handler is None:
            err = f"unknown op {req.op[:40]!r}; this supervisor answers {', '.join(ops)}"
            sock.send_multipart([ident, *envelope, control.encode_reply(False, error=err, req_id=req.id)])
            emit(ev.ActionEvent(op=req.op[:40], by=by, ok=False, result=err))
            continue
        try:
            check_args(req.op, req.args)
            result = handler(req.args, by)
        except (Refused, config_mod.ConfigError) as e:
            sock.send_multipart([ident, *envelope, control.encode_reply(False, error=str(e), req_id=req.id)])
            emit(ev.ActionEvent(op=req.op, by=by, ok=False, result=str(e)[:500]))
            continue
        except Exception as e:  # a bug of ours: refused and on the record, never the supervisor's death
            log.exception("control op %s", req.op)
            err = f"{req.op}: internal error, {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            sock.send_multipart([ident, *envelope, control.encode_reply(False, error=err, req_id=req.id)])
            emit(ev.ActionEvent(op=req.op, by=by, ok=False, result=err))
            continue
        if isinstance(result, msgspec.Raw):
            reply = b'{"ok":true,"error":"","id":%d,"result":%s}' % (req.id, bytes(result))
        else:
            reply = control.encode_reply(True, result, req_id=req.id)
        sock.send_multipart([ident, *envelope, reply])
        if req.op not in ("ping", "snapshot"):  # queries are not actions; everything else is recorded
            emit(ev.ActionEvent(op=req.op, by=by, ok=True, result=result))
