"""The teacher service over real sockets: proxy and workers in threads, the client in the test."""

import time

import numpy as np
import pytest
import zmq

from gkd_core.teacher import protocol
from gkd_core.teacher.client import TeacherClient, TeacherUnavailable
from gkd_core.teacher.server import TeacherProxy, TeacherWorkerLoop
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.reporter import Reporter

V = 11


def score(ids: np.ndarray, topk: int, left_pad: np.ndarray | None = None):
    """A real, deterministic scorer: log-softmax of a fixed table indexed by the previous token."""
    table = np.log(np.arange(1, V + 1, dtype=np.float64))[None, :] * ((np.arange(V)[:, None] % 3) + 1)
    logits = table[ids]
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    top = np.argsort(-logp, axis=-1)[..., :topk]
    return top, np.take_along_axis(logp, top, -1)


@pytest.fixture
def service():
    sink = zmq.Context.instance().socket(zmq.PULL)
    sink.bind("tcp://127.0.0.1:*")
    rep = Reporter("teacher/proxy", ingest=sink.last_endpoint.decode(), heartbeat_s=10)
    proxy = TeacherProxy(rep)
    proxy.start()
    workers = []

    def add_worker(name):
        w = TeacherWorkerLoop(name, proxy.backend_address, score, Reporter(name, ingest="", heartbeat_s=10))
        w.start()
        workers.append(w)
        return w

    yield proxy, add_worker, sink
    for w in workers:
        w.stop()
    proxy.stop()
    rep.close()
    sink.close()


def test_microbatches_in_flight_and_counts_on_both_sides(service):
    proxy, add_worker, sink = service
    add_worker("teacher/0")
    add_worker("teacher/1")
    client = TeacherClient(proxy.frontend_address, num_microbatches=4, max_in_flight=2, timeout_s=5)
    ids = np.random.default_rng(0).integers(0, V, size=(10, 7))
    top, logp = client.score(ids, topk=3)
    want_top, want_logp = score(ids, 3)
    assert np.array_equal(top, want_top) and np.allclose(logp, want_logp, atol=1e-6)
    assert (client.sent, client.completed, client.timed_out, client.in_flight) == (4, 4, 0, 0)
    assert proxy.received == 4 and proxy.served == 4 and sum(proxy.per_worker.values()) == 4
    proxy.report()
    deadline = time.monotonic() + 3
    seen = None
    while time.monotonic() < deadline and seen is None:
        if sink.poll(100):
            e = wire.decode(sink.recv())
            if isinstance(e, ev.TeacherEvent) and e.side == "server" and e.served == 4:
                seen = e
    assert seen is not None and seen.latency_ms["p50"] > 0 and seen.queue_depth == 0


def test_a_dead_teacher_is_timed_out_and_retried_then_comes_back(service):
    proxy, add_worker, _ = service
    w = add_worker("teacher/0")
    client = TeacherClient(proxy.frontend_address, num_microbatches=2, timeout_s=0.5, max_retries=1)
    ids = np.zeros((4, 3), dtype=np.int64)
    client.score(ids, topk=2)
    w.stop()  # the teacher is gone: nobody answers
    t0 = time.monotonic()
    with pytest.raises(TeacherUnavailable, match="failed 2 times"):
        client.score(ids, topk=2)
    assert time.monotonic() - t0 < 3.0  # bounded: 2 attempts of 0.5 s, not forever
    assert client.timed_out >= 2 and client.in_flight == 0
    assert proxy.received > proxy.served  # the server side shows requests nobody served
    add_worker("teacher/1")  # the teacher is back
    top, _ = client.score(ids, topk=2)
    assert top.shape == (4, 3, 2) and client.completed >= 4


def test_a_bad_request_gets_an_error_answer_not_a_dead_worker(service):
    proxy, add_worker, _ = service
    add_worker("teacher/0")
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.linger = 0
    d.connect(proxy.frontend_address)
    d.send_multipart([b"", b"7", b"\x93garbage"])
    assert d.poll(3000)
    _, rid, reply = d.recv_multipart()
    assert rid == b"7" and "teacher/0" in protocol.decode_reply(reply).error
    d.close()
    client = TeacherClient(proxy.frontend_address, timeout_s=2)
    assert client.score(np.ones((2, 2), dtype=np.int64), topk=1)[0].shape == (2, 2, 1)
    assert (proxy.per_worker["teacher/0"], proxy.errors["teacher/0"]) == (2, 1)  # the error counted as its worker's


def test_a_worker_that_answers_errors_is_counted_by_the_proxy_and_fails_the_client(service):
    """The ``error_teacher`` fault: every answer an error. The client retries and gives up saying the worker's error;
    the proxy counts each error as that worker's (its reply marked, not decoded), in the counts it reports."""
    proxy, add_worker, sink = service
    good, bad = add_worker("teacher/0"), add_worker("teacher/1")
    bad.errors_until = float("inf")
    client = TeacherClient(proxy.frontend_address, num_microbatches=8, max_in_flight=8, timeout_s=5, max_retries=1)
    with pytest.raises(TeacherUnavailable, match="teacher/1: RuntimeError: fault injected"):
        client.score(np.ones((8, 3), dtype=np.int64), topk=1)
    assert proxy.errors["teacher/1"] >= 2 and "teacher/0" not in proxy.errors and client.failed >= 2
    good.stop()
    bad.errors_until = 0.0  # the fault is over: answers again
    assert client.score(np.ones((2, 2), dtype=np.int64), topk=1)[0].shape == (2, 2, 1)
    proxy.report()
    deadline = time.monotonic() + 5
    said = None
    while said is None and time.monotonic() < deadline:
        if sink.poll(100):
            e = wire.decode(sink.recv())
            said = e if isinstance(e, ev.TeacherEvent) and e.side == "server" and e.errors else None
    assert said is not None and said.errors["teacher/1"] == proxy.errors["teacher/1"]
