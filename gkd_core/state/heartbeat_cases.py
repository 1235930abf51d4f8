"""The reducer's heartbeat cases: a worker's heartbeat, alone or in its relay's batch, and the relay's clock
(``RelayClock``), which says once a batch that every worker of its roster is alive, in place of a beat per
worker that said nothing new. O(1) a beat: 65,536 of them a second at the largest.
"""

from __future__ import annotations

from gkd_core.state import memory_cases
from gkd_core.state.beat_table import BEAT_TABLE, BeatTable
from gkd_core.state.records import CPU_IDLE_PCT, WorkerState
from gkd_core.state.run_record import RunRecord
from gkd_core.telemetry import events as ev


def on_heartbeat(st: RunRecord, e: ev.HeartbeatEvent) -> None:
    """A process's heartbeat by itself: the beat of a batch of one (``on_beat``)."""
    w = st.worker_seen(e.src, e.ts)
    if e.ts > st.newest_beat:
        st.newest_beat = e.ts
    if on_beat(st, w, ev.beat_of_event(e)) and (table := st.kept_if(BEAT_TABLE)) is not None:
        assert type(table) is BeatTable
        table.heard(e.src, e.ts)


def on_heartbeats(st: RunRecord, e: ev.HeartbeatsEvent) -> None:
    """A relay's batch (or the supervisor's merge of several): each full beat, then the relays' clocks, which
    say the other beats, one a batch (a relay started again unclocks its workers, and those who join it are
    clocked again). A full beat that came with its relay's clock is of the relay's roster (its joining may
    have been lost to a supervisor that took the run over between the batch and its log line), unless the
    clock is of another epoch than the relay's known one: an old relay's late batch is of workers its
    successor never vouched for (and a new one's roster is ``joined``)."""
    workers = st.workers
    relays: set[str] | tuple[()] = ()
    if e.clocks:
        known = st.relay_clocks
        other_epoch = {c.relay for c in e.clocks if (was := known.get(c.relay)) is not None and was[0] != c.epoch}
        relays = {c.relay for c in e.clocks} - other_epoch
    newest = st.newest_beat
    table = st.kept_if(BEAT_TABLE)  # (its writes inline: one store a beat)
    rows, beat_of = (table.row, table.beat) if isinstance(table, BeatTable) else ({}, None)
    for b in e.beats:  # (at the largest, thousands of full beats a second: the walk stays here, one call a beat)
        ts = b.ts
        if ts > newest:
            newest = ts
        w = workers.get(b.src)
        if w is None:
            w = st.worker_seen(b.src, ts)
        elif ts > w.last_seen:
            w.last_seen = ts
        if on_beat(st, w, b):
            if beat_of is not None and (row := rows.get(b.src)) is not None:
                beat_of[row] = ts
            if not w.clock_via and w.via in relays:
                w.clock_via = w.via
                st.touch(w)  # (who vouches for it: the beat table's)
    st.newest_beat = newest
    for c in e.clocks:
        if on_clock(st, c) and (c.joined or c.quiet):
            on_roster(st, c)


def on_beat(st: RunRecord, w: WorkerState, b: ev.Beat) -> bool:
    """A worker's beat, whichever way it came: its numbers, its memory, and when its CPU went idle; False for
    one no newer than its last (one the log restated, or a duplicate): nothing new."""
    ts = b.ts
    if ts <= w.last_heartbeat:
        return False
    cpu = b.cpu
    if cpu >= CPU_IDLE_PCT:
        w.cpu_low_since = None
    elif w.cpu_low_since is None:  # the beat's share is of the interval since the one before (a relay sends the
        w.cpu_low_since = w.last_heartbeat or ts  # beat before a crossing with it)
    w.last_heartbeat = ts
    if w.oom_killed is not None and ts > w.oom_killed.ts:
        w.oom_killed = None  # it beats after its death was said: the kill was another's (the supervisor's guess)
        st.touch(w)
    if b.dropped != w.dropped:
        st.touch(w)
    w.rss, w.cpu, w.dropped = b.rss, cpu, b.dropped
    if b.mem is not None:
        memory_cases.on_memory(st, w, b.mem, ts)
    return True


def on_clock(st: RunRecord, c: ev.RelayClock) -> bool:
    """A relay's clock (``views.heartbeat_at`` reads it); False for one of an epoch before the relay's newest
    (an old relay still running beside its successor, or a merged batch of both): no word of it counts."""
    was = st.relay_clocks.get(c.relay)
    if was is not None and c.epoch != was[0]:
        if c.epoch < was[0]:
            return False
        for each in st.workers.values():  # started again: it vouches for nobody until they join it (a
            if each.clock_via == c.relay:  # relay's restart: rare, and the only walk over every worker here)
                each.clock_via = ""
                st.touch(each)
        was = None
    if was is None or c.ts > was[1]:
        st.relay_clocks[c.relay] = (c.epoch, c.ts)
        if (table := st.kept_if(BEAT_TABLE)) is not None:
            assert type(table) is BeatTable
            table.clocked(c.relay, c.ts)
        if c.ts > st.newest_beat:
            st.newest_beat = c.ts
    return True


def on_roster(st: RunRecord, c: ev.RelayClock) -> None:
    """Who the relay vouches for from now on, and who no more, after the batch's beats (which hold a joining
    worker's first; and, in the log, a quiet one's last numbers before its quiet time)."""
    for src in c.joined:
        w = st.workers.get(src)
        if w is not None:
            w.clock_via = c.relay
            st.touch(w)  # (who vouches for it: the beat table's)
    for src, ts in c.quiet:  # no beat from it for a while: its newest one's time, from here on its own
        w = st.workers.get(src)
        if w is None:
            continue
        if w.clock_via == c.relay:
            w.clock_via = ""
        if ts > w.last_heartbeat:
            w.last_heartbeat = ts
        st.touch(w)
        if ts > w.last_seen:
            w.last_seen = ts
