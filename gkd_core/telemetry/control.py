"""Control requests (DESIGN §5): JSON ``{op, args, id, by}`` -> ``{ok, result, error, id}``.

The client is the "lazy pirate" of the ZeroMQ guide: a DEALER with a deadline per attempt; after a
timeout the socket is closed (linger 0) and a fresh one retries, a bounded number of times. Every try
of one request carries the same id, unique across processes, and the supervisor answers a repeated id
with its first answer without acting again (``supervisor/control_ops.RecentReplies``): a retried
``restart`` restarts once, and its asker gets that restart's own answer.
A tcp control endpoint is authenticated with CurveZMQ: keys are generated into ``RUN/keys`` and
only the client key listed under ``RUN/keys/authorized`` may connect.
"""

from __future__ import annotations

import itertools
import os
import secrets
import time
from pathlib import Path
from typing import Any, cast

import msgspec
import zmq
import zmq.auth

from gkd_core.errors import GkdError
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import A, Receipt
from gkd_core.telemetry.ops import QUERIES

# A request id: a random prefix of this process (31 bits) above a counter (32 bits), so that two clients,
# in two processes or on two machines, do not send the same id and have one's request taken for a repeat
# of the other's (the id stays a positive int64: old clients send small ints, and 0 means "no id").
_ID_COUNTER_BITS = 32


def _new_id_prefix() -> int:
    return (secrets.randbits(31) or 1) << _ID_COUNTER_BITS


_id_prefix = _new_id_prefix()
_ids = itertools.count(1)


def _reseed_ids() -> None:
    """A forked child starts a prefix of its own: it would otherwise repeat its parent's next ids."""
    global _id_prefix, _ids
    _id_prefix, _ids = _new_id_prefix(), itertools.count(1)


os.register_at_fork(after_in_child=_reseed_ids)


def new_request_id() -> int:
    """An id for one request (all its tries), unique across processes."""
    return _id_prefix | (next(_ids) & ((1 << _ID_COUNTER_BITS) - 1))


class ControlError(GkdError, RuntimeError):
    """The supervisor answered ``ok: false``."""


class ControlUnreachable(GkdError, TimeoutError):
    """No answer within the deadline; the message says where we asked."""


class Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    op: str
    args: dict[str, Any] = {}
    # (no token: who may ask is the socket's to say, a private ipc file or CurveZMQ keys; an old client's
    # empty token is an unknown field, ignored)
    id: int = 0
    by: str = ""  # who asks (informative; recorded on the action event)


class Reply(msgspec.Struct, kw_only=True):
    ok: bool
    result: msgspec.Raw = msgspec.Raw(b"null")
    error: str = ""
    id: int = 0


_reply_decoder = msgspec.json.Decoder(Reply)


def encode_reply(ok: bool, result: Any = None, error: str = "", req_id: int = 0) -> bytes:
    return msgspec.json.encode({"ok": ok, "result": result, "error": error, "id": req_id})


_request_decoder = msgspec.json.Decoder(Request)


def decode_request(data: bytes) -> Request:
    """Raises ``ValueError`` saying what is wrong with the request."""
    if len(data) > 64 * 1024:
        raise ValueError(f"request of {len(data)} bytes is larger than 64 KiB")
    try:
        return _request_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as e:
        raise ValueError(f"malformed control request ({e}); expected JSON {{op, args, id, by}}") from None
    except RecursionError:  # arrays within arrays past Python's limit: msgspec recurses once a level
        raise ValueError("malformed control request (nested too deeply); expected JSON {op, args, id, by}") from None


# --- keys ------------------------------------------------------------------------------------


def create_keys(keys_dir: Path, server: str = "server", client: str = "client",
                authorized: str = "authorized") -> None:
    """A server and a client CurveZMQ key pair, private (0600); the client's public key authorized
    (moved to ``keys_dir/authorized``, the folder the authenticator reads)."""
    keys_dir.mkdir(mode=0o700, exist_ok=True)
    allowed = keys_dir / authorized
    allowed.mkdir(mode=0o700, exist_ok=True)
    zmq.auth.create_certificates(str(keys_dir), server)
    zmq.auth.create_certificates(str(keys_dir), client)
    os.replace(keys_dir / f"{client}.key", allowed / f"{client}.key")
    for p in (keys_dir / f"{server}.key", keys_dir / f"{server}.key_secret", keys_dir / f"{client}.key_secret",
              allowed / f"{client}.key"):
        os.chmod(p, 0o600)


def server_curve(sock: zmq.SyncSocket, keys_dir: Path, server: str = "server") -> None:
    public, secret = zmq.auth.load_certificate(str(keys_dir / f"{server}.key_secret"))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def client_curve(sock: zmq.SyncSocket, keys_dir: Path) -> None:
    public, secret = zmq.auth.load_certificate(str(keys_dir / "client.key_secret"))
    server_public, _ = zmq.auth.load_certificate(str(keys_dir / "server.key_secret"))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


# --- client ----------------------------------------------------------------------------------


class ControlClient:
    """Request/reply with the supervisor under a deadline, retried on a fresh socket."""

    def __init__(self, address: str, *, keys_dir: Path | None = None, timeout_s: float = 2.0,
                 retries: int = 2, ctx: zmq.SyncContext | None = None, by: str = ""):
        self.address = address
        self.keys_dir = keys_dir
        self.timeout_s = timeout_s
        self.retries = retries
        self.ctx = ctx or zmq.Context.instance()
        self.by = by or f"{os.environ.get('USER', 'user')}@pid{os.getpid()}"
        self._sock: zmq.SyncSocket | None = None

    @classmethod
    def for_run(cls, run: Path, endpoints: dict[str, Any], **kw: Any) -> ControlClient:
        return cls(endpoints["control"], keys_dir=run / "keys", **kw)

    def _socket(self) -> zmq.SyncSocket:
        if self._sock is None:
            s = self.ctx.socket(zmq.DEALER)
            s.linger = 0
            if self.address.startswith("tcp://"):
                if self.keys_dir is None or not (self.keys_dir / "client.key_secret").exists():
                    s.close()
                    raise ControlUnreachable(
                        f"{self.address} needs CurveZMQ keys; none found in {self.keys_dir} "
                        "(copy RUN/keys from the run's node)"
                    )
                client_curve(s, self.keys_dir)
            try:
                s.connect(self.address)
            except zmq.ZMQError as e:  # an address no transport takes (a damaged endpoints.json)
                s.close()
                raise ControlUnreachable(f"cannot connect to {self.address!r}: {e}") from None
            self._sock = s
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None

    def call(self, args: ops.Answered[A], *, timeout_s: float | None = None, request_id: int | None = None) -> A:
        """The op ``args`` are for (``ops.OP_OF``), carried out by the supervisor: its answer, typed as the op
        declares it (``call(RestartArgs(shrink=True, dry_run=True))`` is a ``Restarted``)."""
        raw = self.request(ops.OP_OF[type(args)], msgspec.to_builtins(args), timeout_s=timeout_s, raw=True,
                           request_id=request_id)
        return cast(A, msgspec.json.decode(raw, type=ops.answer_of(type(args))))

    def hand(self, args: ops.Handed[A], *, timeout_s: float | None = None, request_id: int | None = None) -> Receipt:
        """The op ``args`` are for, handed on (to the job's driver): the supervisor's receipt. The answer, an ``A``,
        comes later as an ``action`` event carrying ``request_id`` (``new_request_id()``, noted before asking:
        the answer may come before the receipt), which ``RunState.outcome(request_id)`` finds."""
        raw = self.request(ops.OP_OF[type(args)], msgspec.to_builtins(args), timeout_s=timeout_s, raw=True,
                           request_id=request_id)
        return msgspec.json.decode(raw, type=Receipt)

    def request(self, op: str, args: dict[str, Any] | None = None, *, timeout_s: float | None = None,
                raw: bool = False, request_id: int | None = None) -> Any:
        """Send ``op`` and return its result (its JSON bytes with ``raw``); ControlError if refused,
        ControlUnreachable on no answer. ``request_id`` (``new_request_id()``): the id a caller that waits
        for the outcome (an ``action`` event carrying it) has noted before asking."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        attempts = self.retries + 1
        # Every op is retried, and every try is the same request: the same id and the same bytes. A query
        # (QUERIES) is safe to repeat by itself. An op that acts (stop, restart, cancel, dump_stacks) is
        # safe to repeat because the supervisor remembers the ids it has answered and answers a repeat
        # with the first answer, acting once. A user who pressed restart once expects one restart and to
        # be told about it; giving up after one try would leave them with "no answer" for a late reply
        # (a supervisor busy or briefly frozen) and tempt them to press it again, under a new id.
        req_id = request_id or new_request_id()
        payload = msgspec.json.encode({"op": op, "args": args or {}, "id": req_id, "by": self.by})
        for _ in range(attempts):
            sock = self._socket()
            sock.send_multipart([b"", payload])
            deadline = time.monotonic() + timeout
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    break
                frames = sock.recv_multipart()
                try:
                    reply = _reply_decoder.decode(frames[-1])
                except (msgspec.DecodeError, msgspec.ValidationError):
                    continue
                if reply.id != req_id:
                    continue  # a late answer to an earlier request of this client (one that gave up)
                if not reply.ok:
                    raise ControlError(reply.error or f"{op} refused")
                return bytes(reply.result) if raw else msgspec.json.decode(reply.result)
            self._reset()  # lazy pirate: a fresh socket for the next attempt
        maybe = ("" if op in QUERIES else
                 "; the request may still reach it and be carried out once (`gkd-tui status` shows the run)")
        raise ControlUnreachable(
            f"no answer to '{op}' from {self.address} within {timeout:g} s ({attempts} attempts){maybe}"
        )

    def close(self) -> None:
        self._reset()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
