"""A late joiner's view of a run: the ZeroMQ "clone" pattern (DESIGN §4).

Subscribe first, then ask the control socket for a snapshot ``{seq, state}``, then apply only
events with a larger ``seq``. Events carry consecutive ``seq`` numbers, so a jump means the PUB
socket dropped something for us (our high-water mark): take a fresh snapshot and go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import msgspec
import zmq

from gkd_core import rundir
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.control import ControlClient

T = TypeVar("T")


class Snapshot(msgspec.Struct):
    seq: int
    state: RunState
    supervisor: dict = {}


_snap = msgspec.json.Decoder(Snapshot)


class RunSubscriber:
    """Keeps ``self.state`` equal to the supervisor's, through snapshots and events (but for the finished
    phases, with ``spans_keep``)."""

    def __init__(self, run: Path | None = None, *, endpoints: dict | None = None, rcvhwm: int = 100_000,
                 ctx: zmq.Context | None = None, timeout_s: float = 2.0, client: ControlClient | None = None,
                 spans_keep: int | None = None):
        """``spans_keep``: the finished phases to keep per worker, when not the supervisor's (a reader that
        runs no diagnosis, the dashboard, keeps none: 16 of 65,536 workers' are 100 MB)."""
        self.run = run
        self.spans_keep = spans_keep
        if endpoints is None:
            assert run is not None, "a run directory, or its endpoints"
            endpoints = rundir.read_endpoints(run)
        self.endpoints = endpoints
        self.ctx = ctx or zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.rcvhwm = rcvhwm
        self.sub.linger = 0
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(self.endpoints["events"])
        self.client = client or ControlClient(self.endpoints["control"], keys_dir=(run / "keys") if run else None,
                                              ctx=self.ctx, timeout_s=timeout_s)
        self.state = RunState() if spans_keep is None else RunState(spans_keep=spans_keep)
        self.seq = 0
        self.snapshots = 0
        self.gaps = 0
        self.rejects = wire.RejectCounter()
        self.supervisor: dict = {}

    def resnapshot(self) -> None:
        """Fetch ``{seq, state}``; events up to ``seq`` are in it, later ones come from SUB."""
        raw = self.client.request("snapshot", raw=True)
        snap = _snap.decode(raw)
        self.state, self.seq, self.supervisor = snap.state, snap.seq, snap.supervisor
        if self.spans_keep is not None:
            self.state.keep_spans(self.spans_keep)
        self.snapshots += 1

    def connect(self, settle_s: float = 0.05, live_within_s: float = 1.0) -> None:
        """Subscribe, then take the snapshot. The SUB must be subscribed before the snapshot is taken, or the
        events in between are lost; ZeroMQ makes a subscription live a moment after ``connect`` returns, and on
        a loaded node that moment outlasted ``settle_s`` (ZeroMQ's "slow joiner"). The first event to arrive
        proves it live (it stays queued: the snapshot holds it, and ``pump`` skips it). A run that says nothing
        for ``live_within_s`` is quiet: a gap after its snapshot would be caught by ``pump`` (a resnapshot)."""
        time.sleep(settle_s)
        self.sub.poll(int(live_within_s * 1000), zmq.POLLIN)
        self.resnapshot()

    def pump(self, timeout_s: float = 0.1, max_events: int = 10_000) -> list[ev.Event | ev.UnknownEvent]:
        """Apply what has arrived (waiting up to ``timeout_s`` for the first); returns the new events."""
        applied: list[ev.Event | ev.UnknownEvent] = []
        if not self.sub.poll(int(timeout_s * 1000), zmq.POLLIN):
            return applied
        for _ in range(max_events):
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                e = wire.decode(frames[-1])
            except wire.Rejected as r:
                self.rejects.add(r)
                continue
            if e.seq <= self.seq:
                continue  # already in the snapshot
            if e.seq != self.seq + 1:
                self.gaps += 1
                self.resnapshot()
                if e.seq <= self.seq:
                    continue
                if e.seq != self.seq + 1:
                    continue  # still ahead of the fresh snapshot: later events will catch us up
            self.state.apply(e)
            self.seq = e.seq
            applied.append(e)
        return applied

    def pump_until(self, answer: Callable[[RunState], T | None], timeout_s: float) -> T | None:
        """``answer(state)`` once it is not None, asked again after each batch of events applied (it waits on the
        socket, never sleeps), or None when ``timeout_s`` passes first."""
        deadline = time.monotonic() + timeout_s
        while (got := answer(self.state)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.pump(left)
        return got

    def close(self) -> None:
        self.sub.close(linger=0)
        self.client.close()
