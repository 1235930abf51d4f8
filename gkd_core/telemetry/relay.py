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


# A beat that says nothing new is not sent: the relay's clock (``RelayClock``) says once a batch that all its
# workers were heard from, most of a healthy run's beats, which then cost the supervisor nothing each. New is
# what a rule reads or a person sees move, and a full beat at least every FULL_BEAT_S.
FULL_BEAT_S = ev.FULL_BEAT_S
CPU_STEP = 15.0  # points of CPU, or a crossing of the idle line ("stuck: no CPU progress")
RSS_STEP = 8 << 20  # bytes of RSS (a leak's worker is named by its growth: 8 MB is far below one)


# A memory scope's reading is new when its use moved by 1/MEM_STEP of what was left of the scope (its limit less its
# use), or the node's available memory by 1/MEM_STEP of itself, the way industrial telemetry reports a value past a
# deadband: a leak that would fill the scope within memory_growing's warning (90 s) moves that much in under
# 1.4 s, so its readings come every beat, while a node's page cache breathing by tens of MB on a terabyte says
# nothing (nor, to a cgroup of a few GB, the node's memory moving with other jobs). Where what is left of the scope,
# or of the node, is under MEM_TIGHT of the scope's limit (node_memory_low's 10 % and memory_growing's critical
# 80 % used lie there) every reading is new. Without it every node's batch held a full beat each second for its
# memory's sake: half the full beats at 131,072 workers.
MEM_STEP = 64
MEM_TIGHT = 0.25


def same_memory(was: ev.MemoryBeat, m: ev.MemoryBeat) -> bool:
    """Does the scope's reading ``m`` say nothing that ``was`` (the last one sent of it) did not, to within the
    deadband? A limit or a kill count of its own is new, and any reading of a scope with no limit known."""
    if m.scope != was.scope or m.limit != was.limit or m.oom_kills != was.oom_kills or m.limit <= 0:
        return False
    tight = MEM_TIGHT * m.limit
    if min(was.limit - was.used, m.limit - m.used) < tight or 0 < min(was.available, m.available) < tight:
        return False
    # (each step from what was left when the last was said: it does not shrink as the use nears it)
    return (abs(m.used - was.used) < (was.limit - was.used) / MEM_STEP
            and abs(m.available - was.available) < was.available / MEM_STEP)


def same_beat(last: ev.Beat, b: ev.Beat, scope_known: bool) -> bool:
    """Does ``b`` say nothing that ``last`` (the worker's last full beat) did not? Its memory scope's
    numbers are the relay's to judge (``scope_known``: another beat of the batch says them, or they are
    within the deadband of the last said, ``same_memory``); a scope, a limit or a kill count of its own is
    new."""
    if b.phase != last.phase or b.dropped != last.dropped or b.ts - last.ts >= FULL_BEAT_S:
        return False
    if (b.cpu < CPU_IDLE_PCT) != (last.cpu < CPU_IDLE_PCT) or abs(b.cpu - last.cpu) >= CPU_STEP:
        return False
    if abs(b.rss - last.rss) >= RSS_STEP:
        return False
    m, was = b.mem, last.mem
    if m is None or was is None:
        return m is was
    return scope_known and m.scope == was.scope and m.limit == was.limit and m.oom_kills == was.oom_kills


QUIET_BEATS = 2.5  # a worker of the roster not heard from for this many periods is said quiet (runlog's silence)


class HeartbeatBatcher:
    """Beats in, one encoded ``heartbeats`` event out per ``take``. The relay's, and the benchmark's
    synthetic nodes' (``bench/bench_dashboard.py``): the same message either way.

    Its roster is the workers it vouches for with its clock (``RelayClock``): one joins with its first
    beat, in full, and leaves when it has sent none for ``QUIET_BEATS`` periods (said ``quiet`` with the
    time of its newest); it joins again with its next, in full."""

    def __init__(self, src: str, node: str, run: str = "", heartbeat_s: float = 1.0):
        self.src, self.node, self.run = src, node, run
        self.epoch = time.time()
        self.quiet_s = QUIET_BEATS * heartbeat_s
        self.beats: list[ev.Beat] = []
        self._full: dict[str, ev.Beat] = {}  # each worker's last beat sent in full
        self._unsent: dict[str, ev.Beat] = {}  # each worker's newest beat not sent, if its newest was not
        self._heard: dict[str, float] = {}  # the roster: each worker's newest beat's time
        self._taken: list[str] = []  # the workers whose beats went in full in the last take
        self._said: tuple[list[str], list[tuple[str, float]]] = ([], [])  # the last take's joined and quiet
        self._unsaid: tuple[list[str], list[tuple[str, float]]] = ([], [])  # of a take that was lost
        self._clock_sent = 0.0
        self._scope_said: dict[str, ev.MemoryBeat] = {}  # each memory scope's last reading sent

    def add(self, beat: ev.Beat) -> None:
        self.beats.append(beat)

    def take(self, now: float | None = None) -> list[bytes] | None:
        """The frames ``[b"heartbeats", json]`` of what was added since the last take; None if there is
        nothing to say (no beat, and the roster and its clock as the last take said)."""
        now = time.time() if now is None else now
        full, sent, heard = [], self._full, self._heard
        taken: list[str] = []
        joined, quiet = self._unsaid[0] + [], self._unsaid[1] + []
        scopes: set[str] = set()  # of the memory scopes, those a full beat of this batch says
        for b in self.beats:
            had = heard.get(b.src)
            if had is None:
                joined.append(b.src)
                if quiet and any(src == b.src for src, _ in quiet):  # (said quiet in a take that was lost)
                    quiet = [q for q in quiet if q[0] != b.src]
            if had is None or b.ts > had:
                heard[b.src] = b.ts
            last = sent.get(b.src)
            m = b.mem
            known = m is not None and (m.scope in scopes or ((was := self._scope_said.get(m.scope)) is not None
                                                             and same_memory(was, m)))
            if had is not None and last is not None and same_beat(last, b, known):
                self._unsent[b.src] = b
                continue  # the clock says it
            before = self._unsent.pop(b.src, None)
            if before is not None and (before.cpu < CPU_IDLE_PCT) != (b.cpu < CPU_IDLE_PCT):
                full.append(before)  # idle since the beat before the crossing: the state's "since" is its time
            full.append(b)
            sent[b.src] = b
            taken.append(b.src)
            if m is not None:
                scopes.add(m.scope)
                self._scope_said[m.scope] = m
        for src, ts in list(heard.items()):
            if now - ts > self.quiet_s:
                quiet.append((src, ts))
                del heard[src]
                sent.pop(src, None)  # (its next beat goes in full: it joins again)
                self._unsent.pop(src, None)
                if src in joined:  # (it joined in a take that was lost, and never beat since)
                    joined.remove(src)
        self.beats = []
        clock = min(heard.values(), default=0.0)
        if not (full or joined or quiet) and clock == self._clock_sent:
            return None
        self._taken, self._said, self._unsaid, self._clock_sent = taken, (joined, quiet), ([], []), clock
        e = ev.HeartbeatsEvent(src=self.src, node=self.node, run=self.run, ts=now, beats=full,
                               clocks=[ev.RelayClock(self.src, self.epoch, clock, tuple(joined), tuple(quiet))])
        return [b"heartbeats", wire.encode(e)]

    def lost(self) -> None:
        """The last take was not sent (the supervisor's queue full): its full beats never arrived, so the
        next beats of those workers go in full; who joined or went quiet in it is said again."""
        for src in self._taken:
            self._full.pop(src, None)
        self._taken = []
        self._unsaid, self._said = self._said, ([], [])
        self._clock_sent = 0.0  # (and its clock, however little it moved)


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
        self.batcher = HeartbeatBatcher(src, node, run, heartbeat_s=interval_s)
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
        batcher, send = self.batcher, push.send_multipart
        next_flush = time.monotonic() + self.interval_s
        try:
            while not self._stop.is_set():
                if pull.poll(max(0, int((next_flush - time.monotonic()) * 1000)) + 1):
                    self._pass_on(pull.recv_multipart, send)
                now = time.monotonic()
                if now >= next_flush:
                    self._send(send, batcher.take())
                    next_flush += self.interval_s
                    if next_flush <= now:  # late (a frozen relay): no burst of flushes to catch up
                        next_flush = now + self.interval_s
            self._pass_on(pull.recv_multipart, send)  # what came before the stop (its own agent's last words)
            self._send(send, batcher.take())
        finally:
            push.close(linger=1000)
            pull.close(linger=0)
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def _pass_on(self, recv, send) -> None:
        """What waits on the relay's socket (10,000 messages at the most): heartbeats into the batch, the rest
        forwarded as it came."""
        batcher = self.batcher
        for _ in range(10_000):
            try:
                frames = recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 1 and frames[0].startswith(HEARTBEAT_PREFIX):
                beat = wire.beat_of(frames[0])
                if beat is not None:
                    batcher.add(beat)
                    if len(batcher.beats) >= MAX_BEATS:
                        self._send(send, batcher.take())
                    continue
            self._send(send, frames)  # anything else as it came: the supervisor checks it
            self.forwarded += 1

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
