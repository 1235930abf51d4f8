"""Teacher requests and replies: msgpack with raw array bytes (no pickle on the wire).

Frames: a client sends ``[b"", id, request]``; the proxy forwards it to a worker; the worker
answers ``[id, worker_name, reply]``. The proxy reads only the frames, never the payload.
"""

from __future__ import annotations

import msgspec
import numpy as np


class TeacherRequest(msgspec.Struct, kw_only=True):
    input_ids: bytes  # int32, row-major
    shape: tuple[int, int]  # [batch, tokens]
    topk: int
    left_pad: bytes = b""  # int32 [batch]: pad tokens at the start of each row (none when empty)


class TeacherReply(msgspec.Struct, kw_only=True):
    ids: bytes = b""  # int32 [batch, tokens, k]
    logp: bytes = b""  # float32 [batch, tokens, k]
    shape: tuple[int, int, int] = (0, 0, 0)
    error: str = ""
    compute_ms: float = 0.0


_enc = msgspec.msgpack.Encoder()
_req = msgspec.msgpack.Decoder(TeacherRequest)
_rep = msgspec.msgpack.Decoder(TeacherReply)
MAX_TOKENS = 1 << 24  # refuse absurd shapes before allocating anything


def encode_request(input_ids: np.ndarray, topk: int, left_pad: np.ndarray | None = None) -> bytes:
    arr = np.ascontiguousarray(input_ids, dtype=np.int32)
    pads = b"" if left_pad is None else np.ascontiguousarray(left_pad, dtype=np.int32).tobytes()
    return _enc.encode(TeacherRequest(input_ids=arr.tobytes(), shape=tuple(arr.shape), topk=topk, left_pad=pads))


def decode_request(data: bytes) -> tuple[np.ndarray, int, np.ndarray]:
    """(ids [B, T], k, left pads [B]; zeros when the request has none)."""
    req = _req.decode(data)
    b, t = req.shape
    if b * t > MAX_TOKENS or b * t * 4 != len(req.input_ids) or not 1 <= req.topk <= 1 << 16:
        raise ValueError(f"inconsistent teacher request: shape {req.shape}, {len(req.input_ids)} bytes, "
                         f"topk {req.topk}")
    if req.left_pad and len(req.left_pad) != b * 4:
        raise ValueError(f"inconsistent teacher request: {len(req.left_pad)} bytes of left pads for {b} rows")
    pads = np.frombuffer(req.left_pad, dtype=np.int32) if req.left_pad else np.zeros(b, dtype=np.int32)
    if len(pads) and (pads.min() < 0 or pads.max() >= t):
        raise ValueError(f"inconsistent teacher request: left pads outside [0, {t})")
    return np.frombuffer(req.input_ids, dtype=np.int32).reshape(b, t), req.topk, pads


def encode_reply(ids: np.ndarray, logp: np.ndarray, compute_ms: float) -> bytes:
    ids = np.ascontiguousarray(ids, dtype=np.int32)
    logp = np.ascontiguousarray(logp, dtype=np.float32)
    return _enc.encode(TeacherReply(ids=ids.tobytes(), logp=logp.tobytes(), shape=tuple(ids.shape),
                                    compute_ms=compute_ms))


def encode_error(message: str) -> bytes:
    return _enc.encode(TeacherReply(error=message))


def decode_reply(data: bytes) -> TeacherReply:
    return _rep.decode(data)


def reply_arrays(rep: TeacherReply) -> tuple[np.ndarray, np.ndarray]:
    shape = rep.shape
    n = int(np.prod(shape))
    if len(rep.ids) != n * 4 or len(rep.logp) != n * 4:
        raise ValueError(f"teacher reply of shape {shape} has {len(rep.ids)}/{len(rep.logp)} bytes")
    return (np.frombuffer(rep.ids, dtype=np.int32).reshape(shape),
            np.frombuffer(rep.logp, dtype=np.float32).reshape(shape))
