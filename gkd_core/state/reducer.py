"""The reducer's cases: how each kind of event changes a ``RunRecord`` (``RunState.apply`` looks
the event's type up in ``HANDLERS``). Pure: the state and the event in, nothing else read. The weight sync's
and the collectives' cases are in ``sync_cases``, the teacher's in ``teacher_cases``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gkd_core.state import gpu_cases, heartbeat_cases, memory_cases, sync_cases, teacher_cases
from gkd_core.state.records import (
    FLOWS_KEEP,
    IDLE_MARK_S,
    IDLE_MARKS_KEEP,
    METRICS_KEEP,
    OOM,
    STACK_TEXT_KEEP,
    AlertState,
    LogLine,
    MetricsPoint,
    PhaseSpan,
    RayNode,
    RayPlacementGroup,
    StackRecord,
    WorkerState,
    alert_key,
)
from gkd_core.state.run_record import RunRecord
from gkd_core.state.views import vouch_s
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import RecoverySaid
from gkd_core.telemetry.evidence import blocked_of
from gkd_core.vocab import RUN_STATUSES, SYNC_OPEN, WORKER_ENDED


def _on_run(st: RunRecord, e: ev.RunEvent) -> None:
    if e.run:
        st.run = e.run
    if not st.started:
        st.started = e.ts
    st.state = e.state
    st.restarts = e.restart
    if e.config_digest:
        st.config_digest = e.config_digest
    if e.total_steps is not None:
        st.total_steps = e.total_steps
    if e.heartbeat_s and math.isfinite(e.heartbeat_s) and e.heartbeat_s > 0:
        st.heartbeat_s = e.heartbeat_s
    if e.heartbeat_s and e.heartbeat_log_s is not None:
        vouch = vouch_s(e.heartbeat_s, e.heartbeat_log_s)
        if math.isfinite(vouch):  # periods near the float's end (no run's) overflow, and a keyframe has no inf
            st.vouch_s = vouch
    st.exit_code = e.exit_code
    st.reason = e.reason
    st.log_tail = list(e.log_tail)
    if e.state == "running":
        st.oom = []
        st.running_since = e.ts
        # a new driver: a collective the old ranks were in is no one's to join now (the new ranks make their groups
        # anew); kept until then, for what a failed run's dead rank was inside
        st.collectives = {}
    for line in e.log_tail:
        if OOM.search(line):
            _note_oom(st, e.ts, "driver", line)
    if e.state in RUN_STATUSES and e.state != "running":
        # the driver's workers are gone with it; a new driver registers its own
        for w in st.workers.values():
            if w.phase not in WORKER_ENDED:
                w.ended_in = w.phase
                w.phase, w.phase_since, w.detail = "exited", e.ts, f"run {e.state}"
                st.mark_moved(w)
        if st.sync is not None and st.sync.state in SYNC_OPEN:
            st.sync.state = "cancelled"


def _on_worker(st: RunRecord, e: ev.WorkerEvent) -> None:
    w = st.worker_seen(e.src, e.ts)
    if e.role and e.role != w.role:
        w.role = e.role
        st.mark_moved(w)
    w.rank = e.rank if e.rank is not None else w.rank
    if (e.actor_id and e.actor_id != w.actor_id) or (e.pid and e.pid != w.pid):
        # a new incarnation under the same name (a teacher the driver started again): what Ray said
        # of the one before is not of this one
        w.ray_state, w.ray_task, w.ray_task_since, w.ray_death_cause, w.ray_required = "", "", None, "", {}
        w.waits_on, w.sends, w.flows = [], [], []  # the waits, calls and counts were the old process's
        w.oom_killed = None  # (so was its death)
        st.waiting.discard(w.src)
    w.node, w.pid, w.gpus, w.actor_id, w.via = e.node, e.pid, list(e.gpus), e.actor_id, e.via
    w.replaceable = e.replaceable
    if not w.phase or w.phase in WORKER_ENDED:
        w.phase, w.phase_since, w.detail = "init", e.ts, ""
        st.mark_moved(w)
    st.touch(w)  # (its node and pid, Ray's word of it reset: what the indexes keep by)


def _on_phase(st: RunRecord, e: ev.PhaseEvent) -> None:
    w = st.worker_seen(e.src, e.ts)
    if e.phase != w.phase or (e.call is not None and e.call != w.phase_call):  # (the same method called anew)
        # a late sighting (older than the phase it would end) makes no span; a call that began and
        # ended within the same millisecond (Ray's task times) makes one of no length
        if w.phase and w.phase not in WORKER_ENDED and e.ts >= w.phase_since and st.spans_keep:
            w.spans.append(PhaseSpan(w.phase, w.phase_step, w.phase_since, e.ts, w.phase_call, e.peak_rss))
            if len(w.spans) > st.spans_keep:
                del w.spans[0]
        if w.phase in WORKER_ENDED and e.phase not in WORKER_ENDED:
            st.touch(w)  # (back from the ended phases: the beat table set it aside)
        w.phase = e.phase
        if e.phase not in ("idle", "failed"):  # its failure's own phase change may come after the sync's word
            w.blocked_by = ""
        w.phase_since = e.started if e.started is not None else e.ts
        w.phase_step = e.step
        w.phase_call = e.call
        st.mark_moved(w)
    w.deadline, w.detail, w.in_flight = e.deadline, e.detail, e.in_flight
    if e.waits_on != w.waits_on:
        w.waits_on, w.waits_since = list(e.waits_on[:ev.WAITS_ON_MAX]), e.ts
        if w.waits_on:
            st.waiting.add(w.src)
        else:
            st.waiting.discard(w.src)
    _count_idle(w, e.ts)
    if e.step is not None:
        w.step = e.step
        if st.step is None or e.step > st.step:
            st.step = e.step


def _count_idle(w: WorkerState, ts: float) -> None:
    """Its idle seconds, as its phase says it now: a stretch idle or waiting on others ends, or begins; and
    a pipeline stage's mark of them, once every IDLE_MARK_S."""
    idle = w.phase == "idle" or bool(w.waits_on)
    if w.idle_from is not None and not idle:
        w.idle_s += max(0.0, ts - w.idle_from)
        w.idle_from = None
    elif w.idle_from is None and idle:
        w.idle_from = ts
    if w.sends and (not w.idle_marks or ts - w.idle_marks[-1][0] >= IDLE_MARK_S):
        w.idle_marks.append((ts, w.idle_s + (ts - w.idle_from if w.idle_from is not None else 0.0)))
        if len(w.idle_marks) > IDLE_MARKS_KEEP:
            del w.idle_marks[0]


def _on_flow(st: RunRecord, e: ev.FlowEvent) -> None:
    w = st.workers.get(e.src)
    if w is None:
        return
    e = ev.FlowEvent(ts=e.ts, src=e.src, calls=dict(list(e.calls.items())[:ev.FLOW_CALLS_MAX]),
                     queues=[ev.QueueDepth(q.name, q.depth, q.puts, q.behind[:ev.STALENESS_BUCKETS])
                             for q in e.queues[:ev.FLOW_QUEUES_MAX]], serves=e.serves[:ev.FLOW_SERVES_MAX])
    st.in_pipeline.add(w.src)
    before = {q.name: q.behind for q in w.flows[-1].queues} if w.flows else {}
    w.flows.append(e)
    if len(w.flows) > FLOWS_KEEP:
        del w.flows[0]
    for q in e.queues:
        st.series.note_queue(f"{e.src} {q.name}", e.ts, q.depth, mean_behind(before.get(q.name, []), q.behind))


def mean_behind(before: list[int], now: list[int]) -> float | None:
    """How many versions behind the samples taken between two counts of a queue's were, on average (the last
    bucket counted as its own number); None when none was taken (or the counts went down: a process anew)."""
    taken = [n - (before[i] if i < len(before) else 0) for i, n in enumerate(now)]
    if not taken or min(taken) < 0 or not sum(taken):
        return None
    return sum(i * n for i, n in enumerate(taken)) / sum(taken)


def _on_metrics(st: RunRecord, e: ev.MetricsEvent) -> None:
    st.metrics.append(MetricsPoint(
        step=e.step, ts=e.ts, loss=e.loss, kl=e.kl, agreement=e.agreement,
        tokens_per_s=e.tokens_per_s, timing=dict(e.timing), grad_norm=e.grad_norm, skipped=e.skipped,
        sample_agreement=e.sample_agreement, completion_len=e.completion_len, eos_share=e.eos_share,
        eval_kl=e.eval_kl, evaluated=e.evaluated, bad_steps=e.bad_steps, epoch=e.epoch,
    ))
    if e.skipped:
        st.bad_steps.append(e.step)
        del st.bad_steps[:-METRICS_KEEP]
    if st.first_metrics is None:
        st.first_metrics = st.metrics[-1]
    if len(st.metrics) > METRICS_KEEP:
        del st.metrics[0]
    if st.step is None or e.step > st.step:
        st.step = e.step


def _on_stack(st: RunRecord, e: ev.StackEvent) -> None:
    if e.target:
        if e.target in st.stacks:
            st.stacks_prev[e.target] = st.stacks[e.target]
        st.stacks[e.target] = StackRecord(
            dump_id=e.dump_id, method=e.method, ts=e.ts, text=e.text[:STACK_TEXT_KEEP], error=e.error
        )


def _on_ray(st: RunRecord, e: ev.RayEvent) -> None:
    w = st.workers.get(e.target)  # never creates one: Ray's view is of workers the run knows
    # (nor of an incarnation before the one registered: Ray's news of it may come late)
    if w is not None and not (e.actor_id and w.actor_id and e.actor_id != w.actor_id):
        if (e.state, e.death_cause, e.required) != (w.ray_state, w.ray_death_cause, w.ray_required):
            st.touch(w)
        w.ray_state, w.ray_task, w.ray_task_since, w.ray_death_cause = (
            e.state, e.task, e.task_started, e.death_cause)
        w.ray_required = dict(e.required)


def _on_ray_node(st: RunRecord, e: ev.RayNodeEvent) -> None:
    st.ray_nodes[e.node or e.node_id] = RayNode(state=e.state, resources=dict(e.resources), ts=e.ts)


def _on_engine(st: RunRecord, e: ev.EngineEvent) -> None:
    w = st.workers.get(e.src)
    if w is not None:
        w.engine = e


def _on_sends(st: RunRecord, e: ev.SendsEvent) -> None:
    w = st.workers.get(e.src)
    if w is not None:
        w.sends = sorted(set(e.to[:ev.SENDS_MAX]))
        st.in_pipeline.add(w.src)


def _on_ray_pg(st: RunRecord, e: ev.RayPlacementGroupEvent) -> None:
    if e.state == "REMOVED":
        st.ray_pgs.pop(e.pg_id, None)
        return
    old = st.ray_pgs.get(e.pg_id)
    since = old.since if old is not None and old.state == e.state else (e.created or e.ts)
    st.ray_pgs[e.pg_id] = RayPlacementGroup(name=e.name, state=e.state, strategy=e.strategy,
                                              bundles=[dict(b) for b in e.bundles], scheduling=e.scheduling,
                                              since=since, ts=e.ts)


def _on_alert(st: RunRecord, e: ev.AlertEvent) -> None:
    key = alert_key(e.code, e.targets)
    old = st.alerts.get(key)
    if old is not None:  # the workers it held up are free of it, or are listed again below
        _unblock(st, old)
    if e.cleared:
        st.alerts.pop(key, None)
        return
    if e.targets:
        for b in blocked_of(e.evidence):
            w = st.workers.get(b)
            if w is not None and not w.blocked_by and b not in e.targets:
                w.blocked_by = e.targets[0]
    st.alerts[key] = AlertState(
        code=e.code, severity=e.severity, message=e.message, hint=e.hint, targets=list(e.targets),
        since=old.since if old else e.ts, evidence=dict(e.evidence),
    )


def _unblock(st: RunRecord, a: AlertState) -> None:
    """Free the workers ``a`` held up; one that failed of it stays marked until it starts again (its
    next phase), as a sync's failure marks it."""
    for b in blocked_of(a.evidence) if a.targets else ():
        w = st.workers.get(b)
        if w is not None and w.blocked_by == a.targets[0] and w.phase != "failed":
            w.blocked_by = ""


def _on_log(st: RunRecord, e: ev.LogEvent) -> None:
    st.logs.append(LogLine(src=e.src, level=e.level, text=e.message[:500], ts=e.ts))
    if len(st.logs) > 50:
        del st.logs[0]
    if e.level in ("warn", "error") and OOM.search(e.message):
        _note_oom(st, e.ts, e.src, e.message)


def _note_oom(st: RunRecord, ts: float, src: str, line: str) -> None:
    st.oom.append((ts, src, line[:500]))
    del st.oom[:-8]


def _on_action(st: RunRecord, e: ev.ActionEvent) -> None:
    st.actions.append(e)
    if len(st.actions) > 50:
        del st.actions[0]
    if isinstance(e.result, RecoverySaid):  # the policy, said anew as it acts
        st.recovery = e.result.said()


HANDLERS: dict[type, Callable[[RunRecord, Any], None]] = {
    ev.RunEvent: _on_run,
    ev.WorkerEvent: _on_worker,
    ev.PhaseEvent: _on_phase,
    ev.HeartbeatEvent: heartbeat_cases.on_heartbeat,
    ev.HeartbeatsEvent: heartbeat_cases.on_heartbeats,
    ev.SyncEvent: sync_cases.on_sync,
    ev.SyncPartEvent: sync_cases.on_sync_part,
    ev.TeacherEvent: teacher_cases.on_teacher,
    ev.GpuEvent: gpu_cases.on_gpu,
    ev.GpusEvent: gpu_cases.on_gpus,
    ev.MetricsEvent: _on_metrics,
    ev.StackEvent: _on_stack,
    ev.AlertEvent: _on_alert,
    ev.LogEvent: _on_log,
    ev.ActionEvent: _on_action,
    ev.RayEvent: _on_ray,
    ev.RayNodeEvent: _on_ray_node,
    ev.RayPlacementGroupEvent: _on_ray_pg,
    ev.CollectivesEvent: sync_cases.on_collectives,
    ev.EngineEvent: _on_engine,
    ev.SendsEvent: _on_sends,
    ev.FlowEvent: _on_flow,
    ev.OomKilledEvent: memory_cases.on_oom_killed,
}
