"""Who may have fallen silent, found without a walk over every worker: each worker's newest heartbeat and the relay
whose clock vouches for it, in flat arrays (``BeatTable``) that the reducer writes as beats and clocks come and
numpy reads at once.

The stale heartbeat's rule asks, every pass, which workers have not been heard from for a while (``silent_workers``).
A walk over every worker (``liveness.silent_among``) cost 20-28 ms at 131,072 workers on the development machine's
kind, each pass (2026-11-30); the table's one vectorised comparison, under a millisecond, names a few candidates,
each judged as the walk judges it. Its answer is the walk's, worker for worker and word for word
(``tests/unit/test_beat_table.py`` holds them side by side on random runs): the table may think a worker older
than it is, never younger.

Kept exact by three writers: the reducer writes each beat's time and each relay clock's as they come (one store
each: thousands of full beats a second at the largest); what changes rarely (a worker's relay, a quiet time, a
phase out of the ended ones) is fed (``RunRecord.touch``), and its row is read again from the worker before the
next question, or between questions (``keep_up``); a new worker, fed as it is made, takes the next row (rows keep
the state's order: workers are never removed). A worker found ended is set aside (its row is ``inf``) until a beat
or a feed says otherwise.
"""

from __future__ import annotations

import math
from array import array

from gkd_core.state.liveness import FROZEN, LATE, Judged, Limits, others_heard, silence
from gkd_core.state.records import WorkerState
from gkd_core.state.run_record import RunRecord
from gkd_core.vocab import WORKER_ENDED

BEAT_TABLE = "beat_table"  # its name among what a state keeps (``RunRecord.kept``); the reducer writes to it
NO_RELAY = 0  # the relay row of a worker no clock vouches for: its clock is -inf


class BeatTable:
    """Each worker's own newest heartbeat (``WorkerState.last_heartbeat``) and its relay's row, by the worker's row
    (its place in ``RunRecord.workers``); each relay's newest clock (``RunRecord.relay_clocks``), by the relay's."""

    def __init__(self, st: RunRecord) -> None:
        self.srcs: list[str] = []
        self.row: dict[str, int] = {}
        self.beat = array("d")  # its own newest heartbeat; 0: never heard from; inf: ended when last judged
        self.via = array("q")  # the row of the relay whose clock vouches for it (NO_RELAY: none)
        self.relay_row: dict[str, int] = {"": NO_RELAY}
        self.clock = array("d", [-math.inf])
        self._fed = st.feed(moves=False)  # a relay joined or left, a quiet time, a phase out of the ended ones
        for relay, (_, ts) in st.relay_clocks.items():
            self.clocked(relay, ts)
        for w in st.workers.values():
            self._read(w)

    def heard(self, src: str, ts: float) -> None:
        """``src``'s newest heartbeat is at ``ts`` (the reducer's heartbeat cases inline this for their batches)."""
        row = self.row.get(src)
        if row is not None:
            self.beat[row] = ts

    def clocked(self, relay: str, ts: float) -> None:
        """``relay``'s clock is at ``ts`` (as ``relay_clocks`` says it from now on)."""
        row = self.relay_row.get(relay)
        if row is None:
            self.relay_row[relay] = len(self.clock)
            self.clock.append(ts)
        else:
            self.clock[row] = ts

    def silent(self, st: RunRecord, now: float, limits: Limits, least: str = LATE) -> list[tuple[WorkerState, Judged]]:
        """What ``liveness.silent_among`` says of every worker of ``st``, in the same order."""
        import numpy as np  # (the diagnosis's alone: a dashboard never asks)

        self._take(st)
        others = others_heard(st, now, limits)
        before = now - (limits.stall_s if least == FROZEN and not others else limits.shortest(least))
        beat = np.frombuffer(self.beat, dtype=np.float64)
        # heard from: its own beat, or its relay's clock as far as the clock vouches past that beat
        heard = np.maximum(beat, np.minimum(np.frombuffer(self.clock)[np.frombuffer(self.via, dtype=np.int64)],
                                            beat + st.vouch_s))
        rows = np.flatnonzero((heard < before) & (beat > 0.0)).tolist()
        del beat, heard  # (an array may not grow while numpy holds a view of it)
        out = []
        workers, srcs = st.workers, self.srcs
        for row in rows:
            w = workers[srcs[row]]
            if w.phase in WORKER_ENDED:
                self.beat[row] = math.inf  # set aside: a beat, or a phase out of the ended ones, puts it back
                continue
            if w.phase_since >= before:
                continue
            said = silence(st, w, now, limits, others)
            if said.word == FROZEN or (said.word == LATE and least == LATE):
                out.append((w, said))
        return out

    def keep_up(self, st: RunRecord, most: int) -> None:
        """Between questions: the rows of ``most`` of the workers fed (new ones among them) read from them."""
        self._take(st, most)

    def _take(self, st: RunRecord, most: int | None = None) -> None:
        """The rows of the workers fed since (a new one's first word is its making: new rows come in the state's
        order), read again from them; of every worker, when the feed gave up on them."""
        fed = self._fed.take(most)
        for w in (st.workers if fed is None else fed).values():
            self._read(w)

    def _read(self, w: WorkerState) -> None:
        row = self.row.get(w.src)
        if row is None:
            row = self.row[w.src] = len(self.srcs)
            self.srcs.append(w.src)
            self.beat.append(0.0)
            self.via.append(NO_RELAY)
        self.beat[row] = w.last_heartbeat
        if not w.clock_via:
            self.via[row] = NO_RELAY
            return
        relay = self.relay_row.get(w.clock_via)
        if relay is None:  # (a relay whose clock has not come yet vouches for nobody)
            self.clocked(w.clock_via, -math.inf)
            relay = self.relay_row[w.clock_via]
        self.via[row] = relay


def silent_workers(st: RunRecord, now: float, limits: Limits, least: str = LATE) -> list[tuple[WorkerState, Judged]]:
    """The workers of ``st`` not ended whose silence is ``least`` (LATE or FROZEN) or worse, with it: what a walk
    over every worker says (``liveness.silent_among``), from the state's ``BeatTable``."""
    return st.kept(BEAT_TABLE, lambda: BeatTable(st)).silent(st, now, limits, least)
