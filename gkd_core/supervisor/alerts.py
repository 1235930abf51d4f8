"""Alert rules the supervisor evaluates on its RunState.

Each rule returns the alerts that should be active now; the supervisor emits an `alert` event
for each new or changed one and a `cleared` event for each of its own that no longer holds. So
alerts are ordinary events: in the log, in snapshots, and replayed like everything else.
"""

from __future__ import annotations

from gkd_core.state import TERMINAL_PHASES, RunState, alert_key
from gkd_core.supervisor.driver_process import headline
from gkd_core.telemetry.events import AlertEvent

OWNED = ("heartbeat_stale", "sync_slow", "sync_timed_out", "sync_failed", "fingerprint_mismatch", "driver_failed",
         "ingest_rejected", "events_dropped", "gpu_probe_hung", "actor_dead")


def _fmt(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def evaluate(state: RunState, now: float, stall_s: float) -> list[AlertEvent]:
    out: list[AlertEvent] = []
    for w in state.stale_workers(now, stall_s):
        age = now - w.last_heartbeat
        where = f"pid {w.pid} on {w.node}" if w.pid else "no pid registered"
        out.append(AlertEvent(
            severity="critical" if w.phase == "sync_weights" else "warn", code="heartbeat_stale",
            message=f"{w.src} sent no heartbeat for {_fmt(age)} (phase {w.phase}, {where})",
            hint=f"the process is frozen (SIGSTOP, D state) or dead: press d on it, or `gkd-tui dump-stacks {w.src}`",
            targets=[w.src],
        ))
    view = state.sync_view(now)
    s = state.sync
    if view is not None and s is not None:
        pend = ", ".join(view.pending[:6]) + (" …" if len(view.pending) > 6 else "")
        if view.running and view.timeout_s and view.fraction >= 0.5:
            out.append(AlertEvent(
                severity="warn", code="sync_slow",
                message=f"sync {view.sync_id} at {_fmt(view.elapsed_s)} of its {_fmt(view.timeout_s)} timeout; "
                        f"waiting for {pend or 'nobody?'}",
                hint="dump the stragglers' stacks (d); a NCCL broadcast with no progress means a peer is gone",
                targets=list(view.pending),
            ))
        elif s.state == "timed_out":
            out.append(AlertEvent(
                severity="critical", code="sync_timed_out",
                message=f"sync {s.sync_id} timed out after {_fmt(s.elapsed_s)}; pending: {pend}",
                hint="dump their stacks (d), then cancel the sync (c) or restart smaller (r)",
                targets=list(s.pending),
            ))
        elif s.state == "failed":
            out.append(AlertEvent(
                severity="critical", code="sync_failed", message=f"sync {s.sync_id} failed: {s.error[:200]}",
                hint="see the worker's log; restart (r) resumes from the latest checkpoint", targets=list(s.pending),
            ))
        if s.fingerprint_ok is False:
            out.append(AlertEvent(
                severity="critical", code="fingerprint_mismatch",
                message=f"after sync {s.sync_id} a rollout worker's weights differ from the actor's",
                hint="the rollout engine generates with stale weights; restart (r)",
            ))
    if state.state == "running":
        for w in state.workers.values():
            if w.ray_state == "DEAD" and w.phase not in TERMINAL_PHASES:
                out.append(AlertEvent(
                    severity="critical", code="actor_dead",
                    message=f"Ray reports {w.src}'s actor DEAD (pid {w.pid or '?'} on {w.node or '?'})"
                            + (f": {w.ray_death_cause[:160]}" if w.ray_death_cause else ""),
                    hint="out of memory or killed? read its log (enter on it); restart (r) resumes from the "
                         "latest checkpoint",
                    targets=[w.src],
                ))
    for node, probe, seconds in state.hung_probes(now):
        name = "NVML" if probe == "nvml" else probe
        out.append(AlertEvent(
            severity="critical", code="gpu_probe_hung",
            message=f"{name} on {node} has not answered for {_fmt(seconds)}",
            hint="the GPU driver is wedged (the seeds' frozen nvidia-smi): check `dmesg` for Xid errors; "
                 "a worker stuck in CUDA will not come back, restart (r) on healthy nodes",
            targets=[f"agent/{node}"] if probe == "nvml" else [f"agent/{node}", probe],
        ))
    if state.state == "failed":
        tail = headline(state.log_tail)
        out.append(AlertEvent(
            severity="critical", code="driver_failed", message=f"driver {state.reason}: {tail}"[:300],
            hint="read RUN/logs/driver.log; `gkd-tui restart` resumes from the latest checkpoint",
        ))
    dropped = {w.src: w.dropped for w in state.workers.values() if w.dropped}
    if dropped:
        total = sum(dropped.values())
        out.append(AlertEvent(
            severity="info", code="events_dropped",
            message=f"{total} events dropped by {len(dropped)} sender(s) (queue full or supervisor away)",
            hint="the senders are too chatty or the supervisor too slow; counts only, the run goes on",
        ))
    return out


def diff(state: RunState, wanted: list[AlertEvent]) -> list[AlertEvent]:
    """The events that move ``state.alerts`` (for the codes in OWNED) to ``wanted``."""
    out = []
    keys = set()
    for a in wanted:
        key = alert_key(a.code, a.targets)
        keys.add(key)
        cur = state.alerts.get(key)
        # the message of a stale heartbeat changes every second; re-emit only on a real change
        if cur is None or cur.severity != a.severity or (cur.message != a.message and a.code not in (
                "heartbeat_stale", "sync_slow", "gpu_probe_hung")):
            out.append(a)
    for key, cur in state.alerts.items():
        if cur.code in OWNED and key not in keys and cur.code != "ingest_rejected":
            out.append(AlertEvent(code=cur.code, targets=list(cur.targets), severity=cur.severity,
                                  message=cur.message, cleared=True))
    return out
