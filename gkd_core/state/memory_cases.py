"""The reducer's memory cases: each heartbeat's memory (its scope's use and limit) kept with the worker and
its scope, and a worker the OOM killer ended. O(1) a heartbeat: 65,536 of them a second at the largest.

Only the newest readings are kept: a replay has the log's heartbeats, not every one the live state had, so
anything learned from their sequence (the growth) is the diagnosis's own (diagnosis/memory_growth), and
the state a replay rebuilds is the live one's.
"""

from __future__ import annotations

from gkd_core.state.records import ScopeMemory, WorkerState
from gkd_core.state.run_record import RunRecord
from gkd_core.telemetry import events as ev

# scopes remembered (each node's, and the cgroups of its workers): 65,536 GPUs are 8,192 nodes of 8. Past
# it, the quarter heard from longest ago are let go at once, so that a new scope costs O(1) on the whole
SCOPES_KEEP = 65_536


def scope_key(node: str, scope: str) -> str:
    return f"{node}|{scope}"


def on_memory(st: RunRecord, w: WorkerState, mem: ev.MemoryBeat | None, ts: float) -> None:
    if mem is None:
        return
    if w.mem is None or w.mem.scope != mem.scope:
        st.touch(w)  # (in another scope: who is in which is the memory rules' to know)
    w.mem = mem
    key = scope_key(w.node, mem.scope)
    s = st.mem_scopes.get(key)
    made = s is None
    if s is None:
        if len(st.mem_scopes) >= SCOPES_KEEP:
            by_age = sorted(st.mem_scopes, key=lambda k: st.mem_scopes[k].ts)
            for old in by_age[:SCOPES_KEEP // 4]:
                del st.mem_scopes[old]
                st.touch_scope(old, None)
        s = st.mem_scopes[key] = ScopeMemory(node=w.node, scope=mem.scope)
    if ts >= s.ts:
        s.used, s.limit, s.available, s.oom_kills, s.ts = mem.used, mem.limit, mem.available, mem.oom_kills, ts
    elif not made:
        return  # (an older word of the scope than one already taken: another worker's, later)
    st.touch_scope(key, s, made)  # (a new scope is said made whatever its word: an index learns of it once)


def on_oom_killed(st: RunRecord, e: ev.OomKilledEvent) -> None:
    w = st.workers.get(e.worker)
    if w is not None:
        w.oom_killed = e
        st.touch(w)
