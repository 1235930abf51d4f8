"""The teacher client: microbatches, a bounded number in flight, a deadline per request,
the socket recreated after a timeout (lazy pirate), bounded retries, and counts.

The seeds' "teacher received no requests" is answered by these counts: `sent` against the
server's `received` says which side is stuck.
"""

from __future__ import annotations

import itertools
import time
from collections import deque

import msgspec
import numpy as np
import zmq

from gkd_core.errors import GkdError
from gkd_core.teacher import protocol
from gkd_core.teacher.stats import LatencyWindow
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter


class TeacherUnavailable(GkdError, RuntimeError):
    """A microbatch failed after every retry; the message says how and where."""


class TeacherClient:
    def __init__(self, address: str, *, num_microbatches: int = 1, max_in_flight: int = 4, timeout_s: float = 30.0,
                 max_retries: int = 3, reporter: Reporter | None = None, ctx: zmq.Context | None = None):
        self.address = address
        self.num_microbatches = num_microbatches
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.rep = reporter
        self.ctx = ctx or zmq.Context.instance()
        self.sent = self.completed = self.failed = self.timed_out = 0
        self.in_flight = 0
        self.latency = LatencyWindow()
        self._ids = itertools.count(1)
        self._sock: zmq.Socket | None = None
        self._resend = False

    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            self._sock = self.ctx.socket(zmq.DEALER)
            self._sock.linger = 0
            self._sock.connect(self.address)
        return self._sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def resend(self, address: str) -> None:
        """Send everything in flight again, now, to ``address``: the server that had it died and a
        new one was started (on new ports, if it was the proxy). Not counted as a retry."""
        self._reset()
        self.address = address
        self._resend = True

    def report(self) -> None:
        if self.rep is not None:
            self.rep.emit(ev.TeacherEvent(side="client", sent=self.sent, completed=self.completed, failed=self.failed,
                                          timed_out=self.timed_out or msgspec.UNSET, in_flight=self.in_flight,
                                          latency_ms=self.latency.quantiles()))

    def score(self, input_ids: np.ndarray, topk: int, on_wait=None,
              left_pad: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k ids and log-probs [B, T, k] for every position of ``input_ids`` [B, T], whose rows
        start with ``left_pad`` [B] pad tokens (none when not given).

        ``on_wait`` is called about every 100 ms while waiting (the driver serves commands there).
        Raises ``TeacherUnavailable`` when a microbatch fails ``max_retries`` + 1 times."""
        chunks = np.array_split(np.arange(len(input_ids)), min(self.num_microbatches, len(input_ids)))
        todo = deque((i, idx) for i, idx in enumerate(chunks) if len(idx))
        attempts = {i: 0 for i, _ in todo}
        results: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        waiting: dict[bytes, tuple[int, np.ndarray, float]] = {}  # request id -> (chunk, rows, sent at)
        next_report = time.monotonic() + 1.0
        try:
            while todo or waiting:
                sock = self._socket()
                while todo and len(waiting) < self.max_in_flight:
                    i, idx = todo.popleft()
                    rid = str(next(self._ids)).encode()
                    sock.send_multipart([b"", rid, protocol.encode_request(
                        input_ids[idx], topk, None if left_pad is None else left_pad[idx])])
                    waiting[rid] = (i, idx, time.monotonic())
                    attempts[i] += 1
                    self.sent += 1
                self.in_flight = len(waiting)
                if sock.poll(100):
                    frames = sock.recv_multipart()
                    if len(frames) != 3 or frames[1] not in waiting:
                        continue  # an answer to a request we gave up on
                    i, idx, t0 = waiting.pop(frames[1])
                    rep = protocol.decode_reply(frames[2])
                    if rep.error:
                        self.failed += 1
                        self._retry_or_raise(i, idx, attempts, todo, f"the teacher answered: {rep.error}")
                        continue
                    results[i] = protocol.reply_arrays(rep)
                    self.completed += 1
                    self.latency.add((time.monotonic() - t0) * 1e3)
                now = time.monotonic()
                expired = [rid for rid, (_, _, t0) in waiting.items() if now - t0 > self.timeout_s]
                if expired:
                    # lazy pirate: the socket may hold a dead connection; all in flight go again on a new one
                    self._reset()
                    for rid in list(waiting):
                        i, idx, _ = waiting.pop(rid)
                        if rid in expired:
                            self.timed_out += 1
                            self._retry_or_raise(i, idx, attempts, todo,
                                                 f"no answer from {self.address} within {self.timeout_s:g} s")
                        else:
                            attempts[i] -= 1
                            todo.appendleft((i, idx))
                if on_wait is not None:
                    on_wait()
                if self._resend:
                    self._resend = False
                    for rid in list(waiting):
                        i, idx, _ = waiting.pop(rid)
                        attempts[i] -= 1
                        todo.appendleft((i, idx))
                if now >= next_report:
                    self.report()
                    next_report = now + 1.0
        except TeacherUnavailable:
            waiting.clear()  # given up on: late answers are ignored by id
            raise
        finally:
            self.in_flight = len(waiting)
            self.report()
        order = sorted(results)
        return (np.concatenate([results[i][0] for i in order]), np.concatenate([results[i][1] for i in order]))

    def _retry_or_raise(self, i: int, idx: np.ndarray, attempts: dict, todo: deque, why: str) -> None:
        if attempts[i] > self.max_retries:
            raise TeacherUnavailable(
                f"teacher microbatch {i} failed {attempts[i]} times ({why}); sent {self.sent}, completed "
                f"{self.completed}, timed out {self.timed_out}: is the teacher server up? "
                "`gkd-tui status` shows its received/served counts"
            )
        todo.append((i, idx))

    def close(self) -> None:
        self._reset()
