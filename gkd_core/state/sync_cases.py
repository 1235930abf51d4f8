"""The reducer's cases for the weight sync and the collectives: a sync's own events (the driver's: started,
progress, its end), each member's word of the part it is in (``sync_part``), and where each rank stands in
its groups' collectives. ``reducer.HANDLERS`` holds them with the others."""

from __future__ import annotations

import math

import msgspec

from gkd_core.state.records import MAX_GROUPS, SYNC_HISTORY_KEEP, SyncPartNow, SyncState
from gkd_core.state.run_record import RunRecord
from gkd_core.telemetry import events as ev
from gkd_core.vocab import SYNC_OPEN

INSIDE_KEEP = 32  # a group's times inside its collectives kept (collective_inside): its usual wait, their median


def on_sync(st: RunRecord, e: ev.SyncEvent) -> None:
    s = st.sync
    if s is not None and e.sync_id < s.sync_id:
        _late(st, e)  # the driver's word on a sync whose next one a member has begun already
        return
    if s is None or s.sync_id != e.sync_id:
        if s is not None:
            archive_sync(st, s)
        started = e.ts - e.elapsed_s
        # a sender's absurd numbers (ts and elapsed near the float's ends) must not make an inf, which a
        # keyframe's JSON cannot hold
        s = st.sync = SyncState(sync_id=e.sync_id, state=e.state,
                                  started=started if math.isfinite(started) else e.ts)
    s.state, s.last_ts = e.state, e.ts
    s.timeout_s = e.timeout_s or s.timeout_s
    s.elapsed_s = e.elapsed_s
    s.pending, s.done = list(e.pending), list(e.done)
    if not set(e.pending).issubset(s.members) or not set(e.done).issubset(s.members):
        s.members = list(dict.fromkeys([*s.members, *e.pending, *e.done]))
    if e.state == "failed" and e.pending:
        for b in e.blocked:
            if b in st.workers and b not in e.pending:
                st.workers[b].blocked_by = e.pending[0]
    if e.fingerprint_ok is not None:
        s.fingerprint_ok, s.differ = e.fingerprint_ok, list(e.differ)
    s.error = e.error or s.error
    if e.step is not None:
        s.step = e.step
    if e.fingerprint_ok is False:
        st.fingerprint_miss = msgspec.structs.replace(s)
    if e.state not in SYNC_OPEN:
        archive_sync(st, s)


def _late(st: RunRecord, e: ev.SyncEvent) -> None:
    """An older sync's end, after its successor began (the members' words travel apart from the driver's):
    its record in the history gets its end; the current sync stays current."""
    old = next((h for h in reversed(st.sync_history) if h.sync_id == e.sync_id), None)
    if old is None or e.state in SYNC_OPEN:
        return
    old.state, old.elapsed_s, old.error = e.state, e.elapsed_s, e.error or old.error
    if e.fingerprint_ok is not None:
        old.fingerprint_ok, old.differ = e.fingerprint_ok, list(e.differ)
    st.series.note_sync(old.sync_id, old.step, old.elapsed_s, old.timeout_s, old.state, old.parts_took)


def on_sync_part(st: RunRecord, e: ev.SyncPartEvent) -> None:
    s = st.sync
    if s is None or s.sync_id != e.sync_id:
        if e.state != "began" or (s is not None and e.sync_id < s.sync_id):
            return  # the end of a part of a sync already archived, or a late word of an older one
        if s is not None:
            archive_sync(st, s)
        s = st.sync = SyncState(sync_id=e.sync_id, state="started", started=e.ts, step=e.step)
    if e.state == "began":
        s.parts_now[e.src] = SyncPartNow(e.part, e.started if e.started is not None else e.ts)
        return
    now = s.parts_now.get(e.src)
    if now is not None and now.part == e.part:
        del s.parts_now[e.src]
    began = e.started if e.started is not None else (now.since if now is not None else None)
    if began is None or not math.isfinite(e.ts - began) or e.ts < began:
        return
    s.parts_took[e.part] = max(s.parts_took.get(e.part, 0.0), e.ts - began)
    if s.state not in SYNC_OPEN:  # its member's word came after the driver's that the sync ended
        archive_sync(st, s)


def archive_sync(st: RunRecord, s: SyncState) -> None:
    s.parts_now = {}  # an ended sync has nobody in it
    st.series.note_sync(s.sync_id, s.step, s.elapsed_s, s.timeout_s, s.state, s.parts_took)
    hist = st.sync_history
    if hist and hist[-1].sync_id == s.sync_id:
        hist[-1] = msgspec.structs.replace(s)
    else:
        hist.append(msgspec.structs.replace(s))
        if len(hist) > SYNC_HISTORY_KEEP:
            del hist[0]


def on_collectives(st: RunRecord, e: ev.CollectivesEvent) -> None:
    named = {g.group for g in e.groups}
    for group, members in list(st.collectives.items()):
        if group not in named and members.pop(e.src, None) is not None and not members:
            del st.collectives[group]  # it left the group (destroyed, or a new one made)
    for g in e.groups[:MAX_GROUPS]:
        if g.group in st.collectives or len(st.collectives) < MAX_GROUPS * 16:
            members = st.collectives.setdefault(g.group, {})
            old = members.get(e.src)
            members[e.src] = g
            if g.left and g.left == g.entered and (old is None or old.left != g.left):
                _note_inside(st, g.group, g.left_at - g.entered_at)


def _note_inside(st: RunRecord, group: str, took: float) -> None:
    """A rank's time inside a collective of ``group``, kept among the group's last INSIDE_KEEP."""
    if not (0.0 <= took < math.inf):
        return  # a sender's clock gone backwards, or absurd numbers
    inside = st.collective_inside.get(group)
    if inside is None:
        if len(st.collective_inside) >= MAX_GROUPS * 16:  # groups made anew under new names: the oldest forgotten
            del st.collective_inside[next(iter(st.collective_inside))]
        inside = st.collective_inside[group] = []
    inside.append(took)
    if len(inside) > INSIDE_KEEP:
        del inside[0]
