"""The workers' events read off the ingest sockets (ipc, and tcp once opened) into the Recorder, at a pace
that lets them gather: the supervisor's loop reads through this (between two turns of its alerts' pass too).
"""

from __future__ import annotations

import time

from gkd_core.supervisor.recorder import INGEST_BATCH, Recorder
from gkd_core.supervisor.sockets import Sockets

# Once the ingest is emptied, it is read again no sooner than this. At 65,536 workers 8,192 batches come a
# second, and a loop that woke for each paid a poll, a publish and the reducer's call for every one of them;
# in 5 ms some forty gather and are taken as one event (Recorder._take_batches), the way a network driver
# coalesces its interrupts. A phase change reaches the screen at most that much later.
COALESCE_S = 0.005


class Ingest:
    def __init__(self, rec: Recorder, sockets: Sockets):
        self.rec, self.sockets = rec, sockets
        self.emptied = False  # by the last read (not cut off at INGEST_BATCH: then it is read on at once)
        self.behind = False  # the last read was cut off: more waits than one read takes in

    def read(self, ready: dict) -> None:
        """The sockets ``ready`` (a poll's) that are the ingest's."""
        s, read = self.sockets, 0
        if s.ingest in ready:
            read = self.rec.drain(s.ingest)
        if s.ingest_tcp is not None and s.ingest_tcp in ready:
            read = max(read, self.rec.drain(s.ingest_tcp))
        self.emptied = 0 < read < INGEST_BATCH
        self.behind = read >= INGEST_BATCH

    def gather(self) -> None:
        """Before the loop polls again: after a read that emptied the ingest, the time for more to gather."""
        if self.emptied:
            time.sleep(COALESCE_S)

    def last(self) -> None:
        """Everything there is now, whether or not its socket was polled (the run's end: what the workers said
        last is worth keeping)."""
        self.rec.drain(self.sockets.ingest)
        if self.sockets.ingest_tcp is not None:
            self.rec.drain(self.sockets.ingest_tcp)
