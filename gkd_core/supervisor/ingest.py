"""The workers' events read off the ingest sockets (ipc, and tcp once opened) into the Recorder, at a pace
that lets them gather: the supervisor's loop reads through this, and so does its alerts' pass between two
rules.
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
        self.between_s = 0.0  # of the alerts' pass under way (``pass_begins``): the time taken in between rules
        self._between_read = 0  # and the messages

    def read(self, ready: dict) -> None:
        """The sockets ``ready`` (a poll's) that are the ingest's."""
        s, read = self.sockets, 0
        if s.ingest in ready:
            read = self.rec.drain(s.ingest)
        if s.ingest_tcp is not None and s.ingest_tcp in ready:
            read = max(read, self.rec.drain(s.ingest_tcp))
        self.emptied = 0 < read < INGEST_BATCH

    def gather(self) -> None:
        """Before the loop polls again: after a read that emptied the ingest, the time for more to gather."""
        if self.emptied:
            time.sleep(COALESCE_S)

    def pass_begins(self) -> None:
        self.between_s, self._between_read = 0.0, 0

    def between(self) -> None:
        """What came meanwhile, between two rules of the alerts' pass (a whole pass is some 100 ms at 65,536
        workers, which every event would wait for at once); its time is kept apart from the pass's own. At most
        INGEST_BATCH a pass: a backlog is the loop's to take in, with its chores (the log's flush, control
        requests) between its turns."""
        left = INGEST_BATCH - self._between_read
        if left <= 0:
            return
        start, s = time.monotonic(), self.sockets
        read = self.rec.drain(s.ingest, left)
        if s.ingest_tcp is not None and read < left:
            read += self.rec.drain(s.ingest_tcp, left - read)
        self._between_read += read
        self.between_s += time.monotonic() - start

    def last(self) -> None:
        """Everything there is now, whether or not its socket was polled (the run's end: what the workers said
        last is worth keeping)."""
        self.rec.drain(self.sockets.ingest)
        if self.sockets.ingest_tcp is not None:
            self.rec.drain(self.sockets.ingest_tcp)
