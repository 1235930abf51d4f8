"""RunState: the one reducer (DESIGN §4). A pure function of the event sequence.

The supervisor answers snapshots with it, the dashboard renders it, the run log's reader
(``gkd_core.runlog``) rebuilds it from ``events.jsonl`` and the tests call it directly.
Everything in it is a msgspec Struct, so a snapshot is ``msgspec.json.encode(state)`` and a late
joiner decodes it back to an equal value. Views that depend on the clock (time in phase,
heartbeat age, a sync's elapsed time) take ``now`` as an argument and are never stored.

- ``records``: what the state is made of (a worker, a sync, an alert ...) and what it keeps;
- ``run_record``: ``RunRecord``, the state's fields (what the reducer's cases change, typed against it);
- ``run_state``: ``RunState``, the whole: the fields, the views and ``apply``;
- ``reducer``: how each kind of event changes it;
- ``views``: what is derived from it (``now`` from the caller);
- ``liveness``: whether a worker is alive, late, frozen or dead (the one judge the rules and the dashboard ask).
"""

from gkd_core.state.records import (
    CPU_IDLE_PCT,
    GPU_FULL,
    MAX_GROUPS,
    METRICS_KEEP,
    OOM,
    SPANS_KEEP,
    STACK_TEXT_KEEP,
    SYNC_HISTORY_KEEP,
    TEACHER_HISTORY_KEEP,
    UTIL_AVG_S,
    AlertState,
    CollectiveView,
    GpuRow,
    MetricsPoint,
    PhaseSpan,
    ProbeHang,
    RayNode,
    RayPlacementGroup,
    StackRecord,
    SyncState,
    SyncView,
    TeacherSide,
    TeacherState,
    TeacherTotals,
    WorkerState,
    alert_key,
)
from gkd_core.state.run_state import RunState, decode_state, encode_state

__all__ = [
    "METRICS_KEEP", "SYNC_HISTORY_KEEP", "MAX_GROUPS", "TEACHER_HISTORY_KEEP", "STACK_TEXT_KEEP",
    "OOM", "SPANS_KEEP", "CPU_IDLE_PCT", "PhaseSpan", "WorkerState",
    "SyncState", "SyncView", "CollectiveView", "TeacherSide", "TeacherState", "TeacherTotals", "GpuRow",
    "GPU_FULL", "UTIL_AVG_S", "ProbeHang", "RayNode", "RayPlacementGroup", "AlertState", "StackRecord",
    "MetricsPoint", "alert_key", "RunState", "decode_state", "encode_state",
]
