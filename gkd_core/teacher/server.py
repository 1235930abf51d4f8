"""The teacher server: a ROUTER/DEALER proxy that counts, and workers that answer with top-k.

The proxy never decodes a payload: it reads the request id frame to time each request from
arrival to answer, and the worker-name frame to count per worker. Every second, and when the traffic
stops, it reports a `teacher` event (side=server): received, served, queue depth, per-worker counts,
latency.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

import numpy as np
import zmq

from gkd_core.teacher import protocol
from gkd_core.teacher.stats import LatencyWindow
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter

REPORT_EVERY_S = 1.0
ERROR_MARK = b"error"  # a worker's frame after a reply that is an error: counted by worker at the proxy
FORGET_AFTER_S = 300.0  # a request a dead worker took is forgotten (the client has retried it)


def _drain(sock: zmq.Socket):
    """Every message waiting on ``sock``, without blocking."""
    while True:
        try:
            yield sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return


class _BackgroundLoop:
    """A daemon thread running the subclass's ``_run`` until ``stop``; both teacher loops are one."""

    _stop: threading.Event
    _thread: threading.Thread
    _run: Callable[[], None]  # each loop's own

    def _init_loop(self, name: str) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


class TeacherProxy(_BackgroundLoop):
    def __init__(self, reporter: Reporter, host: str = "127.0.0.1", ctx: zmq.Context | None = None):
        self.rep = reporter
        self.ctx = ctx or zmq.Context.instance()
        self.frontend = self.ctx.socket(zmq.ROUTER)
        self.frontend.linger = 0
        self.frontend.bind(f"tcp://{host}:*")
        self.backend = self.ctx.socket(zmq.DEALER)
        self.backend.linger = 0
        self.backend.bind(f"tcp://{host}:*")
        self.frontend_address = self.frontend.last_endpoint.decode()
        self.backend_address = self.backend.last_endpoint.decode()
        self.received = 0
        self.served = 0
        self.lost = 0
        self.per_worker: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()  # of those served, answered with an error
        self.latency = LatencyWindow()
        self._arrived: dict[tuple[bytes, bytes], float] = {}
        self._init_loop("teacher-proxy")

    def report(self) -> None:
        self.rep.emit(ev.TeacherEvent(side="server", received=self.received, served=self.served,
                                      queue_depth=len(self._arrived), workers=dict(self.per_worker),
                                      errors=dict(self.errors),
                                      latency_ms=self.latency.quantiles(), failed=self.lost))

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.frontend, zmq.POLLIN)
        poller.register(self.backend, zmq.POLLIN)
        next_report = 0.0
        reported = (0, 0, 0)
        try:
            while not self._stop.is_set():
                ready = dict(poller.poll(100))
                now = time.monotonic()
                if self.frontend in ready:
                    for frames in _drain(self.frontend):
                        if len(frames) != 4 or frames[1]:
                            continue  # not [client, b"", id, request]: not one of our clients
                        self.received += 1
                        self._arrived[(frames[0], frames[2])] = now
                        self.backend.send_multipart(frames)
                if self.backend in ready:
                    for frames in _drain(self.backend):
                        # [client, b"", id, worker, reply], and ERROR_MARK after an error's reply
                        if len(frames) not in (5, 6):
                            continue
                        client, _, req_id, worker, reply = frames[:5]
                        if frames[5:] == [ERROR_MARK]:
                            self.errors[worker.decode(errors="replace")] += 1
                        t = self._arrived.pop((client, req_id), None)
                        if t is not None:
                            self.latency.add((now - t) * 1e3)
                        self.served += 1
                        self.per_worker[worker.decode(errors="replace")] += 1
                        self.frontend.send_multipart([client, b"", req_id, reply])
                counts = (self.received, self.served, self.lost)
                # every second, and once the traffic stops (a quiet poll): the last answers of a run are
                # on the record before it ends, so the client's and the server's counts add up
                if now >= next_report or (not ready and counts != reported):
                    for key, t in list(self._arrived.items()):
                        if now - t > FORGET_AFTER_S:
                            del self._arrived[key]
                            self.lost += 1
                    self.report()
                    reported = (self.received, self.served, self.lost)
                    next_report = now + REPORT_EVERY_S
        finally:
            self.frontend.close(0)
            self.backend.close(0)


class TeacherWorkerLoop(_BackgroundLoop):
    """Answers requests from the proxy's backend with the teacher's top-k log-probs."""

    def __init__(self, name: str, backend_address: str, score: Callable[[np.ndarray, int, np.ndarray], tuple],
                 reporter: Reporter, ctx: zmq.Context | None = None, on_request: Callable[[], None] | None = None):
        """``on_request``: called as each request arrives (where the worker's armed faults may strike)."""
        self.name = name
        self.address = backend_address
        self.score = score
        self.rep = reporter
        self.ctx = ctx or zmq.Context.instance()
        self.delay_s = 0.0  # fault injection: answer this much later
        self.errors_until = 0.0  # fault injection: answer with an error until then (time.monotonic)
        self.on_request = on_request
        self.served = 0
        self._init_loop(f"teacher-worker[{name}]")

    def _run(self) -> None:
        sock = self.ctx.socket(zmq.REP)
        sock.linger = 0
        sock.connect(self.address)
        try:
            while not self._stop.is_set():
                if not sock.poll(200):
                    continue
                frames = sock.recv_multipart()
                req_id, payload = (frames + [b""])[:2] if len(frames) >= 2 else (b"", b"")
                if self.on_request is not None:
                    try:
                        self.on_request()
                    except Exception as e:  # a fault's hook must never stop the serving
                        self.rep.log(f"{self.name}: its request hook failed ({type(e).__name__}: {e}); serving on",
                                     level="warn")
                t0 = time.perf_counter()
                mark = []
                try:
                    ids, topk, pads = protocol.decode_request(payload)
                    with self.rep.phase("serve"):
                        if self.delay_s:
                            time.sleep(self.delay_s)
                        if time.monotonic() < self.errors_until:
                            raise RuntimeError("fault injected: this teacher worker answers with errors")
                        top_ids, top_logp = self.score(ids, topk, pads)
                    reply = protocol.encode_reply(top_ids, top_logp, (time.perf_counter() - t0) * 1e3)
                except Exception as e:  # a bad request must not kill the server: answer with the error
                    reply = protocol.encode_error(f"{self.name}: {type(e).__name__}: {e}"[:500])
                    mark = [ERROR_MARK]  # the proxy counts the errors by worker without decoding a reply
                sock.send_multipart([req_id, self.name.encode(), reply, *mark])
                self.served += 1
        finally:
            sock.close(0)
