"""A node's relay: its workers' events reach the supervisor through one connection, and their
heartbeats as one message per interval.

One event per worker per second through one Python supervisor is the wall at the largest jobs
(65,536 workers: 65,536 messages a second). The node agent runs a relay: the workers of its node
push to it over ipc (a private folder of this node), it forwards every other event as it came,
and gathers the heartbeats into one ``heartbeats`` event per ``interval_s`` (DESIGN §3): 8,192
messages a second at 8 workers to a node. A worker's heartbeat waits up to one interval more;
its own ``ts`` is kept, so ages are measured from when it was sent.

A relay that freezes takes its node's events with it; the diagnosis names the relay, not its
workers (``diagnosis.rules.heartbeat_stale``).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path

import zmq

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.ingest import Curve, client_socket
from gkd_core.vocab import CPU_IDLE_PCT

# how a Reporter's heartbeat begins (msgspec writes the tag first): the rest is forwarded unread
HEARTBEAT_PREFIX = b'{"kind":"heartbeat",'
MAX_BEATS = 4096  # a batch is sent early when it holds this many (a node of 8 workers sends 8)
MAX_IPC_PATH = 100  # sun_path holds 108 bytes


# A beat that says nothing new goes as [src, ts] (``HeartbeatsEvent.same``): most of a healthy run's, and
# each costs the supervisor a fraction of a full one. New is what a rule reads or a person sees move:
FULL_BEAT_S = 5.0  # a worker's full beat at least this often (the shown CPU and RSS are never older)
CPU_STEP = 15.0  # points of CPU, or a crossing of the idle line ("stuck: no CPU progress")
RSS_STEP = 8 << 20  # bytes of RSS (a leak's worker is named by its growth: 8 MB is far below one)


def same_beat(last: ev.Beat, b: ev.Beat, scope_said: bool) -> bool:
    """Does ``b`` say nothing that ``last`` (the worker's last full beat) did not? Its memory scope's
    numbers go with one beat of the scope in each batch (``scope_said``: one already does); a scope, a
    limit or a kill count of its own is new."""
    if b.phase != last.phase or b.dropped != last.dropped or b.ts - last.ts >= FULL_BEAT_S:
        return False
    if (b.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT) or abs(b.cpu - last.cpu) >= CPU_STEP:
        return False
    if abs(b.rss - last.rss) >= RSS_STEP:
        return False
    m, was = b.mem, last.mem
    if m is None or was is None:
        return m is was
    return scope_said and m.scope == was.scope and m.limit == was.limit and m.oom_kills == was.oom_kills


class HeartbeatBatcher:
    """Beats in, one encoded ``heartbeats`` event out per ``take``. The relay's, and the benchmark's
    synthetic nodes' (``bench/bench_dashboard.py``): the same message either way."""

    def __init__(self, src: str, node: str, run: str = ""):
        self.src, self.node, self.run = src, node, run
        self.beats: list[ev.Beat] = []
        self._full: dict[str, ev.Beat] = {}  # each worker's last beat sent in full
        self._taken: list[str] = []  # the workers whose beats went in full in the last take

    def add(self, beat: ev.Beat) -> None:
        self.beats.append(beat)

    def take(self) -> list[bytes] | None:
        """The frames ``[b"heartbeats", json]`` of what was added since the last take; None if nothing."""
        if not self.beats:
            return None
        full, same, sent = [], [], self._full
        taken: list[str] = []
        self._taken = taken
        scopes: set[str] = set()  # of the memory scopes, those a full beat of this batch says
        for b in self.beats:
            last = sent.get(b.src)
            if last is not None and same_beat(last, b, b.mem is not None and b.mem.scope in scopes):
                same.append((b.src, b.ts))
                continue
            full.append(b)
            sent[b.src] = b
            taken.append(b.src)
            if b.mem is not None:
                scopes.add(b.mem.scope)
        if len(sent) > 2 * len(self.beats) + 64:  # workers that left the node: forget them
            newest = max(b.ts for b in self.beats)
            self._full = {src: b for src, b in sent.items() if newest - b.ts < 4 * FULL_BEAT_S}
        e = ev.HeartbeatsEvent(src=self.src, node=self.node, run=self.run, ts=time.time(), beats=full, same=same)
        self.beats = []
        return [b"heartbeats", wire.encode(e)]

    def lost(self) -> None:
        """The last take was not sent (the supervisor's queue full): its full beats never arrived, so the
        next beats of those workers go in full, not as ``same`` about them."""
        for src in self._taken:
            self._full.pop(src, None)
        self._taken = []


def relay_path(run_id: str, label: str) -> Path:
    """The relay's ipc socket on its node: in this user's private folder of the run (never the run
    directory, which another node may not have), one per node label (several Ray nodes can share a
    machine, as in tests)."""
    base = Path(tempfile.gettempdir()) / f"gkd-{os.getuid()}"
    digest = hashlib.blake2b(label.encode(), digest_size=4).hexdigest()
    return base / run_id / f"relay-{digest}.sock"


def private_dir(path: Path) -> None:
    """Make ``path`` (and its parent) folders of this user only; refuse one that is someone else's."""
    for d in (path.parent, path):
        d.mkdir(mode=0o700, exist_ok=True)
        st = d.stat()
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"{d} is not a private folder of this user; remove it or set TMPDIR")


class Relay:
    """The relay thread: PULL on ``path`` (0600 in a 0700 folder), PUSH to ``upstream``."""

    def __init__(self, src: str, node: str, upstream: str, *, path: Path, run: str = "", curve: Curve | None = None,
                 interval_s: float = 1.0, hwm: int = 100_000, ctx: zmq.Context | None = None):
        self.src, self.upstream, self.path, self.curve = src, upstream, path, curve
        self.interval_s = interval_s
        self.hwm = hwm
        self.batcher = HeartbeatBatcher(src, node, run)
        self.ctx = ctx or zmq.Context.instance()
        self.forwarded = 0
        self.batches = 0
        self.dropped = 0  # messages the supervisor could not take (away, or its queue full)
        self._stop = threading.Event()
        self._bound = threading.Event()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name=f"gkd-relay[{node}]", daemon=True)

    @property
    def address(self) -> str:
        return f"ipc://{self.path}"

    def start(self, timeout_s: float = 5.0) -> str:
        """Bind and run; returns the address the node's workers push to. Raises when it cannot bind
        (the workers then push straight to the supervisor)."""
        if len(str(self.path)) > MAX_IPC_PATH:
            raise OSError(f"the relay's socket path {self.path} is too long for ipc; set TMPDIR to a shorter folder")
        private_dir(self.path.parent)
        self._thread.start()
        if not self._bound.wait(timeout_s):
            raise TimeoutError(f"the relay did not bind {self.path} within {timeout_s:g} s")
        if self._error is not None:
            raise self._error
        return self.address

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        pull = self.ctx.socket(zmq.PULL)
        pull.rcvhwm = self.hwm
        pull.linger = 0
        push = self.ctx.socket(zmq.PUSH)
        push.sndhwm = self.hwm
        push.linger = 0
        try:
            if self.curve is not None:
                client_socket(push, self.curve)
            push.connect(self.upstream)
            pull.bind(self.address)
            os.chmod(self.path, 0o600)
        except Exception as e:
            self._error = e
            pull.close(0)
            push.close(0)
            self._bound.set()
            return
        self._bound.set()
        batcher, recv, send = self.batcher, pull.recv_multipart, push.send_multipart
        next_flush = time.monotonic() + self.interval_s
        try:
            while not self._stop.is_set():
                if pull.poll(max(0, int((next_flush - time.monotonic()) * 1000)) + 1):
                    for _ in range(10_000):
                        try:
                            frames = recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        if len(frames) == 1 and frames[0].startswith(HEARTBEAT_PREFIX):
                            beat = wire.beat_of(frames[0])
                            if beat is not None:
                                batcher.add(beat)
                                if len(batcher.beats) >= MAX_BEATS:
                                    self._send(send, batcher.take())
                                continue
                        self._send(send, frames)  # anything else as it came: the supervisor checks it
                        self.forwarded += 1
                now = time.monotonic()
                if now >= next_flush:
                    self._send(send, batcher.take())
                    next_flush += self.interval_s
                    if next_flush <= now:  # late (a frozen relay): no burst of flushes to catch up
                        next_flush = now + self.interval_s
            self._send(send, batcher.take())
        finally:
            push.close(linger=1000)
            pull.close(linger=0)
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _send(self, send, frames: list[bytes] | None) -> None:
        if not frames:
            return
        try:
            send(frames, zmq.NOBLOCK)
            if frames[0] == b"heartbeats":
                self.batches += 1
        except zmq.Again:
            self.dropped += 1
            if frames[0] == b"heartbeats":
                self.batcher.lost()
