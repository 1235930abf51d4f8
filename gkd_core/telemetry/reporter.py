"""The Reporter: every worker process's line to the supervisor.

A background thread owns a PUSH socket and sends what ``emit`` queued plus a heartbeat every
``heartbeat_s``. ZeroMQ and ``threading.Event.wait`` release the GIL, so heartbeats keep flowing
while the main thread is blocked in C (NCCL, CUDA, a socket): "phase=sync_weights for 412 s"
stays visible, and a missing heartbeat means the process is dead or frozen. A call that keeps the GIL
(a C extension's import, some model loads) silences it too: a process that is starting is judged
against its set-up deadline instead (``diagnosis.rules.workers``). Its first heartbeat goes at once
(before its registration); through a node's relay, which batches heartbeats, it may arrive a second
after, so the diagnosis counts a new process's silence from its own first word, not its name's.

``emit`` never blocks: it encodes, appends to a bounded queue and returns. When the queue is
full or the supervisor is away (the socket's high-water mark reached), events are dropped and
counted; the count rides on every heartbeat.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator

import zmq

from gkd_core import memory, proctree
from gkd_core.telemetry import collectives, wire
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.ingest import Curve, client_socket

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Reporter:
    """Sends this process's events to the run's supervisor (address from ``GKD_INGEST``); over
    tcp from another node with the run's CurveZMQ keys (``curve``, see ``ingest``)."""

    def __init__(self, src: str, *, ingest: str | None = None, run: str | None = None,
                 heartbeat_s: float = 1.0, queue_max: int = 10_000, sndhwm: int = 10_000,
                 ctx: zmq.Context | None = None, start: bool = True, curve: Curve | None = None,
                 with_children: bool = False):
        """``with_children``: the heartbeat's CPU share counts this process's children too (a worker whose
        inference engine runs in child processes); not for a process whose children are no work of its own
        (a node agent's GPU probe, a test's supervisor)."""
        self.src = src
        self.with_children = with_children
        self._memory = memory.MemoryProbe()
        self.run = run if run is not None else os.environ.get("GKD_RUN_ID", "")
        self.ingest = ingest if ingest is not None else os.environ.get("GKD_INGEST", "")
        self.curve = curve
        self.heartbeat_s = heartbeat_s
        self.queue_max = queue_max
        self.dropped = 0
        self.sent = 0
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = threading.Event()
        self._sleeping = False
        self._closing = False
        self._close_deadline = 0.0  # set by close: queued frames may leave until then
        self._phase = "init"
        self._phase_since = time.time()
        self._step: int | None = None
        self._groups_sent: list = []  # the collectives last sent (collectives.snapshot)
        self._tracker_seen = 0
        self._stack: list[str] = []  # phases entered through `with phase(...)`, innermost last
        # the phase (and call) its newest phase event named, the most RSS its heartbeats saw in it, the newest RSS
        self._peak_of: tuple[str, int | None] = ("init", None)
        self._peak_rss = self._last_rss = 0
        self._peak_lock = threading.Lock()  # the phase's end (any thread) against a heartbeat's sample (its own)
        # its own context unless given one: terminating it is the only way ZeroMQ waits until what a
        # socket holds has left (a socket's close returns at once, and ``os._exit`` after it loses it)
        self._own_ctx = ctx is None
        self._ctx = ctx or zmq.Context()
        self._sndhwm = sndhwm
        self._thread = threading.Thread(target=self._run, name=f"gkd-reporter[{src}]", daemon=True)
        self._sock_ready = threading.Event()
        if start:
            self.start()

    # --- called from any thread ------------------------------------------------------------

    def start(self) -> None:
        collectives.TRACKER.listen(self._wake.set)
        self._thread.start()
        self._sock_ready.wait(5.0)

    def emit(self, event: ev.Event) -> None:
        """Queue one event; returns at once. The envelope (src, ts, run) is filled if empty."""
        if not event.src:
            event.src = self.src
        if not event.ts:
            event.ts = time.time()
        event.run = self.run
        if type(event) is ev.PhaseEvent:
            self._phase_peak(event)
        if len(self._queue) >= self.queue_max:
            self.dropped += 1
            return
        self._queue.append(wire.encode(event))  # one frame: the kind frame is for PUB/SUB filtering
        if self._sleeping:
            self._wake.set()

    def _phase_peak(self, e: ev.PhaseEvent) -> None:
        """A phase event that begins another phase (or another call of one: the reducer's test) carries the
        peak of the one it ends; the new one's starts at the newest RSS."""
        with self._peak_lock:
            if e.phase != self._peak_of[0] or (e.call is not None and e.call != self._peak_of[1]):
                e.peak_rss = max(self._peak_rss, self._last_rss)
                self._peak_of, self._peak_rss = (e.phase, e.call), self._last_rss

    def register(self, role: str, rank: int | None = None, *, node: str = "", gpus: list[int] | None = None,
                 actor_id: str = "", via: str = "", replaceable: bool = False) -> None:
        self.emit(ev.WorkerEvent(role=role, rank=rank, node=node or os.uname().nodename, pid=os.getpid(),
                                 gpus=gpus or [], actor_id=actor_id, via=via, replaceable=replaceable))

    def set_phase(self, phase: str, *, step: int | None = None, deadline: float | None = None,
                  detail: str = "") -> None:
        now = time.time()
        if phase != self._phase:
            self._phase, self._phase_since = phase, now
        if step is not None:
            self._step = step
        self.emit(ev.PhaseEvent(phase=phase, step=self._step, started=self._phase_since, deadline=deadline,
                                detail=detail, ts=now))

    @contextlib.contextmanager
    def phase(self, name: str, *, step: int | None = None, deadline: float | None = None,
              timeout_s: float | None = None, detail: str = "") -> Iterator[None]:
        """``with reporter.phase("sync_weights", step=3, timeout_s=60):`` ... then back to the enclosing
        phase (or ``idle`` at the top level)."""
        if deadline is None and timeout_s is not None:
            deadline = time.time() + timeout_s
        self._stack.append(name)
        self.set_phase(name, step=step, deadline=deadline, detail=detail)
        try:
            yield
        except BaseException as e:
            self._stack.pop()
            self.set_phase(self._stack[-1] if self._stack else "idle",
                           detail=f"{name} raised {type(e).__name__}: {e}"[:300])
            raise
        else:
            self._stack.pop()
            self.set_phase(self._stack[-1] if self._stack else "idle")

    def log(self, message: str, level: str = "info") -> None:
        self.emit(ev.LogEvent(level=level, message=message))

    def flush(self, timeout_s: float) -> bool:
        """Wait, up to ``timeout_s``, until what is queued and where this process stands in its collectives
        have gone to the socket: for a process about to stop itself, whose last word must leave first."""
        end = time.monotonic() + timeout_s
        self._wake.set()
        while time.monotonic() < end:
            if not self._queue and self._tracker_seen == collectives.TRACKER.version:
                return True
            time.sleep(0.01)
        return False

    def close(self, timeout_s: float = 1.0) -> None:
        """Send what is queued (up to ``timeout_s``), then stop the thread."""
        self._closing = True
        self._close_deadline = time.monotonic() + timeout_s
        self._wake.set()
        self._thread.join(timeout_s + 1.0)

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the background thread -------------------------------------------------------------

    def _heartbeat(self, cpu: float, rss: int | None = None) -> bytes:
        now = time.time()
        rss = _rss_bytes() if rss is None else rss
        with self._peak_lock:
            self._last_rss = rss
            if rss > self._peak_rss:
                self._peak_rss = rss
        return wire.encode(ev.HeartbeatEvent(
            src=self.src, run=self.run, ts=now, phase=self._phase, elapsed=now - self._phase_since,
            rss=rss, cpu=cpu, dropped=self.dropped, mem=self._memory_beat(),
        ))

    def _memory_beat(self) -> ev.MemoryBeat | None:
        """The scope that limits this process, its use, the node's available memory (gkd_core.memory)."""
        try:
            limit, available = self._memory.sample()
        except Exception as e:  # (it raises nothing by design) never the heartbeat's end
            log.debug("reading this process's memory scope failed: %r", e)
            return None
        if limit is None:
            return None
        return ev.MemoryBeat(limit.where, limit.used, limit.limit, available, limit.oom_kills)

    def _collectives(self) -> None:
        """Where this process stands in its collectives, when that changed since it was last sent."""
        version = collectives.TRACKER.version
        try:
            groups = collectives.snapshot()
        except Exception as e:  # never the heartbeat's end
            log.debug("reading this process's collectives failed: %r", e)
            self._tracker_seen = version
            return
        if groups != self._groups_sent:
            self._groups_sent = groups
            self._queue.append(wire.encode(ev.CollectivesEvent(src=self.src, run=self.run, ts=time.time(),
                                                             groups=groups)))
        self._tracker_seen = version  # only now: `flush` reads it as "queued"

    def _run(self) -> None:
        sock = self._ctx.socket(zmq.PUSH)
        sock.sndhwm = self._sndhwm
        sock.linger = 0
        if self.curve is not None:
            client_socket(sock, self.curve)
        if self.ingest:
            sock.connect(self.ingest)
        self._sock_ready.set()
        q = self._queue
        next_beat = time.monotonic()
        # this process's CPU with its children's (an engine's processes do a rollout worker's work)
        tree = proctree.TreeCpu() if self.with_children and os.path.exists("/proc/self/stat") else None
        last_cpu, last_wall = sum(os.times()[:2]), time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= next_beat:
                    wall = now
                    if tree is not None:
                        used = tree.delta()
                    else:
                        cpu_t = sum(os.times()[:2])
                        used, last_cpu = cpu_t - last_cpu, cpu_t
                    cpu = 100.0 * used / max(wall - last_wall, 1e-6)
                    last_wall = wall
                    q.appendleft(self._heartbeat(round(cpu, 1), tree.rss if tree is not None else None))
                    self._collectives()
                    next_beat = now + self.heartbeat_s
                elif collectives.TRACKER.version != self._tracker_seen:
                    self._collectives()
                send, noblock = sock.send, int(zmq.NOBLOCK)
                while q:
                    data = q[0]  # taken off once sent: `flush` reads an empty queue as "all at the socket"
                    if not self.ingest:
                        self.dropped += 1
                    else:
                        try:
                            send(data, noblock)
                            self.sent += 1
                        except zmq.Again:
                            self.dropped += 1  # supervisor away or slow: count, never block the worker
                    q.popleft()  # the frame peeked (only this thread takes from the left or puts there)
                if self._closing:
                    if not q or time.monotonic() > self._close_deadline:
                        break
                    continue
                self._sleeping = True
                if not q:
                    self._wake.wait(max(0.0, next_beat - time.monotonic()))
                self._sleeping = False
                self._wake.clear()
        finally:
            # give queued frames up to the close deadline to leave the socket
            left = max(0.0, self._close_deadline - time.monotonic())
            sock.close(linger=int(left * 1000))
            if self._own_ctx:
                self._ctx.term()  # blocks until the queue is sent or the linger above has passed
