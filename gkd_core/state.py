"""RunState: the one reducer (DESIGN §4). A pure function of the event sequence.

The supervisor answers snapshots with it, the dashboard renders it, ``replay`` rebuilds it
from ``events.jsonl`` and the tests call it directly. Everything in it is a msgspec Struct, so
a snapshot is ``msgspec.json.encode(state)`` and a late joiner decodes it back to an equal
value. Views that depend on the clock (time in phase, heartbeat age, a sync's elapsed time)
take ``now`` as an argument and are never stored.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from gkd_core.telemetry import events as ev

METRICS_KEEP = 512
SYNC_HISTORY_KEEP = 32
MAX_GROUPS = 64  # process groups a member may report (a job makes a few: world, data parallel, tensor parallel ...)
TEACHER_HISTORY_KEEP = 120
STACK_TEXT_KEEP = 64 * 1024
SEVERITY_ORDER = {"critical": 0, "warn": 1, "info": 2}
TERMINAL_PHASES = ("finished", "failed", "cancelled", "exited")
# what an out-of-memory error says: CUDA's, torch's, the kernel's OOM killer, Ray's memory monitor
# (not a bare "OOM": Ray's message for any dead worker lists "the OOM killer" among possible causes)
OOM = re.compile(r"out of memory|OutOfMemoryError|\bOOM[- ]?(?:killed|error)|oom-kill|Killed process|"
                 r"running low on memory|Failed to allocate memory for KV cache", re.IGNORECASE)
SPANS_KEEP = 16  # finished phases remembered per worker: its peers' times and its own history
CPU_IDLE_PCT = 10.0  # a heartbeat below this CPU share counts as no progress


class PhaseSpan(msgspec.Struct, array_like=True):
    """One finished phase of a worker: what, at which step, from when to when."""

    phase: str
    step: int | None
    started: float
    ended: float
    call: int | None = None  # the call number, for a method (PhaseEvent.call)


class WorkerState(msgspec.Struct, kw_only=True):
    src: str
    role: str = ""
    rank: int | None = None
    node: str = ""
    pid: int = 0
    gpus: list[int] = []
    actor_id: str = ""
    phase: str = ""
    phase_since: float = 0.0
    step: int | None = None
    deadline: float | None = None
    detail: str = ""
    last_seen: float = 0.0  # ts of the newest event from this src
    last_heartbeat: float = 0.0
    rss: int = 0
    cpu: float = 0.0
    dropped: int = 0
    # what Ray says (the `ray` events): the actor's state, and the method running on it since when
    ray_state: str = ""
    ray_task: str = ""
    ray_task_since: float | None = None
    ray_death_cause: str = ""
    ray_required: dict[str, float] = {}  # its resource request, while Ray has not placed it
    phase_step: int | None = None  # the step the current phase began at (its instance, with the phase)
    phase_call: int | None = None  # the current phase's call number, for a method (PhaseEvent.call)
    spans: list[PhaseSpan] = []  # finished phases, oldest first
    cpu_low_since: float | None = None  # every heartbeat since then under CPU_IDLE_PCT
    via: str = ""  # the relay its events go through (its node's agent), "" when they go straight
    # the worker whose death made this one fail (a sync's `blocked`): a victim, not a cause; until it
    # starts something new
    blocked_by: str = ""
    ended_in: str = ""  # the phase it was in when the run ended (its phase is then "exited")
    # RunState.moves when its role, phase or spans last changed: what changed since a pass of the diagnosis
    # is found by comparing one number per worker (the straggler index at 65,536 workers)
    moved: int = 0
    engine: ev.EngineEvent | None = None  # its inference engine's own counts (vLLM), the newest


class SyncState(msgspec.Struct, kw_only=True):
    sync_id: int
    state: str
    started: float
    timeout_s: float = 0.0
    elapsed_s: float = 0.0
    last_ts: float = 0.0
    pending: list[str] = []
    done: list[str] = []
    fingerprint_ok: bool | None = None
    differ: list[str] = []
    error: str = ""
    step: int | None = None


class SyncView(msgspec.Struct):
    """The current sync as the gauge shows it."""

    sync_id: int
    state: str
    elapsed_s: float
    timeout_s: float
    fraction: float  # elapsed / timeout, 0 when there is no timeout
    pending: list[str]
    running: bool


class CollectiveView(msgspec.Struct):
    """A process group's newest collective, as the sync gauge shows it: who is in it, who is not yet,
    who has left it."""

    group: str
    seq: int
    op: str
    world: int
    inside: list[str]  # entered it, not known to have left
    out: list[str]  # not entered yet
    left: list[str]
    since: float  # when the first rank entered it


class TeacherSide(msgspec.Struct, kw_only=True):
    sent: int = 0
    completed: int = 0
    failed: int = 0
    timed_out: int = 0
    in_flight: int = 0
    received: int = 0
    served: int = 0
    queue_depth: int = 0
    workers: dict[str, int] = {}
    latency_ms: dict[str, float] = {}
    ts: float = 0.0
    # when this side last moved: an answer completed (client) or served (server), or nothing was owed
    progress_at: float = 0.0
    received_at: float = 0.0  # server: when `received` last grew
    sent_at: float = 0.0  # client: when `sent` last grew


class TeacherState(msgspec.Struct, kw_only=True):
    by_src: dict[str, TeacherSide] = {}
    # (ts, completed) samples of the client total, for a requests/s sparkline
    history: list[tuple[float, int]] = []


class TeacherTotals(msgspec.Struct):
    sent: int
    completed: int
    failed: int
    timed_out: int
    in_flight: int
    received: int
    served: int
    queue_depth: int
    latency_ms: dict[str, float]


class GpuRow(msgspec.Struct, kw_only=True):
    node: str
    index: int
    uuid: str = ""
    util: float | None = None
    mem_used: int | None = None
    mem_total: int | None = None
    temp: float | None = None
    power: float | None = None
    pids: list[int] = []
    ts: float = 0.0
    error: str = ""
    full_idle_since: float | None = None  # memory at least GPU_FULL, utilisation 0, since then
    util_avg: float | None = None  # utilisation, averaged over about the last minute of readings


GPU_FULL = 0.9
UTIL_AVG_S = 60.0


class ProbeHang(msgspec.Struct, kw_only=True):
    """A GPU probe (NVML, nvidia-smi) whose call has not returned."""

    node: str
    probe: str
    seconds: float  # as of ``at``
    at: float
    detail: str = ""


class RayNode(msgspec.Struct, kw_only=True):
    state: str = ""
    resources: dict[str, float] = {}
    ts: float = 0.0


class RayPlacementGroup(msgspec.Struct, kw_only=True):
    name: str = ""
    state: str = ""
    strategy: str = ""
    bundles: list[dict[str, float]] = []
    scheduling: str = ""
    since: float = 0.0  # first seen in this state
    ts: float = 0.0


class AlertState(msgspec.Struct, kw_only=True):
    code: str
    severity: str
    message: str
    hint: str = ""
    targets: list[str] = []
    since: float = 0.0
    evidence: dict[str, Any] = {}


class StackRecord(msgspec.Struct, kw_only=True):
    dump_id: str
    method: str
    ts: float
    text: str = ""
    error: str = ""


class MetricsPoint(msgspec.Struct, kw_only=True):
    step: int
    ts: float
    loss: float | None = None
    kl: float | None = None
    agreement: float | None = None
    tokens_per_s: float | None = None
    timing: dict[str, float] = {}
    grad_norm: float | None = None
    skipped: bool = False
    sample_agreement: float | None = None
    completion_len: float | None = None
    eos_share: float | None = None
    eval_kl: float | None = None
    evaluated: bool = False
    bad_steps: int = 0
    epoch: float | None = None


class RunState(msgspec.Struct, kw_only=True, weakref=True):
    run: str = ""
    state: str = ""
    config_digest: str = ""
    restarts: int = 0
    exit_code: int | None = None
    reason: str = ""
    log_tail: list[str] = []
    started: float = 0.0
    running_since: float = 0.0  # when the current driver started (a restart starts anew)
    last_ts: float = 0.0
    total_steps: int | None = None
    step: int | None = None
    last_seq: int = 0
    applied: int = 0
    moves: int = 0  # changes to a worker's role, phase or spans, counted (WorkerState.moved)
    spans_keep: int = SPANS_KEEP  # finished phases kept per worker (the diagnosis reads them; a dashboard keeps none)
    unknown: dict[str, int] = {}  # kinds this reader does not know, counted
    workers: dict[str, WorkerState] = {}
    sync: SyncState | None = None
    sync_history: list[SyncState] = []
    # the last sync after which some rollout's weights were not the student's: said for a while even when
    # the next sync, a second later, puts it right (generation ran on stale weights in between)
    fingerprint_miss: SyncState | None = None
    teacher: TeacherState = msgspec.field(default_factory=TeacherState)
    gpus: dict[str, GpuRow] = {}
    probe_hangs: dict[str, ProbeHang] = {}  # "node/probe" -> the probe that has not answered
    gpu_notes: dict[str, str] = {}  # node -> why it has no readings ("no NVIDIA driver on this node")
    ray_nodes: dict[str, RayNode] = {}  # node IP -> its state and resources (Ray's view)
    ray_pgs: dict[str, RayPlacementGroup] = {}  # placement group id -> what it asks for, while not REMOVED
    alerts: dict[str, AlertState] = {}
    metrics: list[MetricsPoint] = []  # the newest METRICS_KEEP
    first_metrics: MetricsPoint | None = None  # the run's first, kept for the summary's "from -> to"
    bad_steps: list[int] = []  # steps skipped for a non-finite loss or gradient, the newest last
    actions: list[dict[str, Any]] = []  # the last few control actions, newest last
    stacks: dict[str, StackRecord] = {}  # target -> its newest stack
    stacks_prev: dict[str, StackRecord] = {}  # target -> the one before: is it stuck in the same place?
    logs: list[str] = []  # the last few `log` events
    # out-of-memory lines of this incarnation of the driver: (ts, src, line); a new driver starts afresh
    oom: list[tuple[float, str, str]] = []
    # process group -> member -> where it stands in the group's collectives (its newest `collectives` event)
    collectives: dict[str, dict[str, ev.CollectiveProgress]] = {}

    # --- the reducer -------------------------------------------------------------------

    def apply(self, e: ev.Event | ev.UnknownEvent) -> None:
        """Fold one event into the state. Never raises on a well-typed event."""
        if e.seq:
            self.last_seq = e.seq
        self.applied += 1
        if e.ts > self.last_ts:
            self.last_ts = e.ts
        handler = _HANDLERS.get(type(e))
        if handler is None:
            self.unknown[e.kind] = self.unknown.get(e.kind, 0) + 1
            return
        handler(self, e)

    def _worker(self, src: str, ts: float) -> WorkerState:
        w = self.workers.get(src)
        if w is None:
            role, _, rank = src.partition("/")
            w = WorkerState(src=src, role=role, rank=_rank(rank), phase_since=ts)
            self.workers[src] = w
            self._moved(w)
        if ts > w.last_seen:
            w.last_seen = ts
        return w

    def keep_spans(self, n: int) -> None:
        """From now on keep ``n`` finished phases per worker (and no more of those kept so far)."""
        self.spans_keep = n
        for w in self.workers.values():
            if len(w.spans) > n:
                w.spans = w.spans[len(w.spans) - n:] if n else []
                self._moved(w)

    def _moved(self, w: WorkerState) -> None:
        self.moves += 1
        w.moved = self.moves

    def _on_run(self, e: ev.RunEvent) -> None:
        if e.run:
            self.run = e.run
        if not self.started:
            self.started = e.ts
        self.state = e.state
        self.restarts = e.restart
        if e.config_digest:
            self.config_digest = e.config_digest
        if e.total_steps is not None:
            self.total_steps = e.total_steps
        self.exit_code = e.exit_code
        self.reason = e.reason
        self.log_tail = list(e.log_tail)
        if e.state == "running":
            self.oom = []
            self.running_since = e.ts
        for line in e.log_tail:
            if OOM.search(line):
                self._note_oom(e.ts, "driver", line)
        if e.state in ("restarting", "starting", "finished", "failed", "stopped"):
            # the driver's workers are gone with it; a new driver registers its own
            for w in self.workers.values():
                if w.phase not in TERMINAL_PHASES:
                    w.ended_in = w.phase
                    w.phase, w.phase_since, w.detail = "exited", e.ts, f"run {e.state}"
                    self._moved(w)
            if self.sync is not None and self.sync.state in ("started", "progress"):
                self.sync.state = "cancelled"

    def _on_worker(self, e: ev.WorkerEvent) -> None:
        w = self._worker(e.src, e.ts)
        if e.role and e.role != w.role:
            w.role = e.role
            self._moved(w)
        w.rank = e.rank if e.rank is not None else w.rank
        if (e.actor_id and e.actor_id != w.actor_id) or (e.pid and e.pid != w.pid):
            # a new incarnation under the same name (a teacher the driver started again): what Ray said
            # of the one before is not of this one
            w.ray_state, w.ray_task, w.ray_task_since, w.ray_death_cause, w.ray_required = "", "", None, "", {}
        w.node, w.pid, w.gpus, w.actor_id, w.via = e.node, e.pid, list(e.gpus), e.actor_id, e.via
        if not w.phase or w.phase in TERMINAL_PHASES:
            w.phase, w.phase_since, w.detail = "init", e.ts, ""
            self._moved(w)

    def _on_phase(self, e: ev.PhaseEvent) -> None:
        w = self._worker(e.src, e.ts)
        if e.phase != w.phase or (e.call is not None and e.call != w.phase_call):  # (the same method called anew)
            # a late sighting (older than the phase it would end) makes no span; a call that began and
            # ended within the same millisecond (Ray's task times) makes one of no length
            if w.phase and w.phase not in TERMINAL_PHASES and e.ts >= w.phase_since and self.spans_keep:
                w.spans.append(PhaseSpan(w.phase, w.phase_step, w.phase_since, e.ts, w.phase_call))
                if len(w.spans) > self.spans_keep:
                    del w.spans[0]
            w.phase = e.phase
            if e.phase not in ("idle", "failed"):  # its failure's own phase change may come after the sync's word
                w.blocked_by = ""
            w.phase_since = e.started if e.started is not None else e.ts
            w.phase_step = e.step
            w.phase_call = e.call
            self._moved(w)
        w.deadline, w.detail = e.deadline, e.detail
        if e.step is not None:
            w.step = e.step
            if self.step is None or e.step > self.step:
                self.step = e.step

    def _on_heartbeat(self, e: ev.HeartbeatEvent) -> None:
        w = self._worker(e.src, e.ts)
        if e.ts <= w.last_heartbeat:
            return  # one the log restated (or a duplicate): nothing new
        if e.cpu >= CPU_IDLE_PCT:
            w.cpu_low_since = None
        elif w.cpu_low_since is None:  # the heartbeat's share is of the interval since the one before
            w.cpu_low_since = w.last_heartbeat or e.ts
        w.last_heartbeat = e.ts
        w.rss, w.cpu, w.dropped = e.rss, e.cpu, e.dropped

    def _on_heartbeats(self, e: ev.HeartbeatsEvent) -> None:
        # the same as `_on_heartbeat` for each beat, inline: 65,536 of them a second at the largest
        workers = self.workers
        for b in e.beats:
            ts = b.ts
            w = workers.get(b.src)
            if w is None:
                w = self._worker(b.src, ts)
            elif ts > w.last_seen:
                w.last_seen = ts
            if ts <= w.last_heartbeat:
                continue
            cpu = b.cpu
            if cpu >= CPU_IDLE_PCT:
                w.cpu_low_since = None
            elif w.cpu_low_since is None:
                w.cpu_low_since = w.last_heartbeat or ts
            w.last_heartbeat = ts
            w.rss, w.cpu, w.dropped = b.rss, cpu, b.dropped

    def _on_sync(self, e: ev.SyncEvent) -> None:
        s = self.sync
        if s is None or s.sync_id != e.sync_id:
            if s is not None:
                self._archive_sync(s)
            started = e.ts - e.elapsed_s
            # a sender's absurd numbers (ts and elapsed near the float's ends) must not make an inf, which a
            # keyframe's JSON cannot hold
            s = self.sync = SyncState(sync_id=e.sync_id, state=e.state,
                                      started=started if math.isfinite(started) else e.ts)
        s.state, s.last_ts = e.state, e.ts
        s.timeout_s = e.timeout_s or s.timeout_s
        s.elapsed_s = e.elapsed_s
        s.pending, s.done = list(e.pending), list(e.done)
        if e.state == "failed" and e.pending:
            for b in e.blocked:
                if b in self.workers and b not in e.pending:
                    self.workers[b].blocked_by = e.pending[0]
        if e.fingerprint_ok is not None:
            s.fingerprint_ok, s.differ = e.fingerprint_ok, list(e.differ)
        s.error = e.error or s.error
        if e.step is not None:
            s.step = e.step
        if e.fingerprint_ok is False:
            self.fingerprint_miss = msgspec.structs.replace(s)
        if e.state not in ("started", "progress"):
            self._archive_sync(s)

    def _archive_sync(self, s: SyncState) -> None:
        hist = self.sync_history
        if hist and hist[-1].sync_id == s.sync_id:
            hist[-1] = msgspec.structs.replace(s)
        else:
            hist.append(msgspec.structs.replace(s))
            if len(hist) > SYNC_HISTORY_KEEP:
                del hist[0]

    def _on_teacher(self, e: ev.TeacherEvent) -> None:
        t = self.teacher
        key = f"{e.side}:{e.src}"
        old = t.by_src.get(key)
        side = TeacherSide(
            sent=e.sent, completed=e.completed, failed=e.failed, timed_out=e.timed_out or 0, in_flight=e.in_flight,
            received=e.received, served=e.served, queue_depth=e.queue_depth, workers=dict(e.workers),
            latency_ms=dict(e.latency_ms), ts=e.ts,
        )
        moved = old is None or e.completed > old.completed or e.served > old.served
        owed = e.in_flight if e.side == "client" else e.queue_depth
        side.progress_at = e.ts if moved or not owed else old.progress_at
        side.received_at = e.ts if old is None or e.received > old.received else old.received_at
        side.sent_at = e.ts if old is None or e.sent > old.sent else old.sent_at
        t.by_src[key] = side
        if e.side == "client":
            total = sum(s.completed for k, s in t.by_src.items() if k.startswith("client:"))
            t.history.append((e.ts, total))
            if len(t.history) > TEACHER_HISTORY_KEEP:
                del t.history[0]

    def _on_gpu(self, e: ev.GpuEvent) -> None:
        node = e.node or e.src
        key = f"{node}/{e.probe or 'nvml'}"
        if e.nvml_hung_s is not None:
            self.probe_hangs[key] = ProbeHang(node=node, probe=e.probe or "nvml", seconds=e.nvml_hung_s, at=e.ts,
                                              detail=e.error)
            return
        self.probe_hangs.pop(key, None)
        if e.index < 0:  # a note about the node (no driver, an NVML error), or one taken back
            if e.error:
                self.gpu_notes[node] = e.error
            else:
                self.gpu_notes.pop(node, None)
            return
        self.gpu_notes.pop(node, None)
        key = f"{node}/{e.index}"
        old = self.gpus.get(key)
        row = self.gpus[key] = GpuRow(
            node=node, index=e.index, uuid=e.uuid, util=e.util, mem_used=e.mem_used, mem_total=e.mem_total,
            temp=e.temp, power=e.power, pids=list(e.pids), ts=e.ts, error=e.error,
        )
        full = bool(e.mem_used and e.mem_total and e.mem_used >= GPU_FULL * e.mem_total)
        if full and e.util is not None and e.util <= 0.0:
            row.full_idle_since = old.full_idle_since if old is not None and old.full_idle_since else e.ts
        if e.util is not None:  # an average over time, whatever the sampling interval
            if old is None or old.util_avg is None:
                row.util_avg = e.util
            else:
                weight = min(1.0, max(0.0, e.ts - old.ts) / UTIL_AVG_S)
                row.util_avg = old.util_avg + weight * (e.util - old.util_avg)

    def _on_metrics(self, e: ev.MetricsEvent) -> None:
        self.metrics.append(MetricsPoint(
            step=e.step, ts=e.ts, loss=e.loss, kl=e.kl, agreement=e.agreement,
            tokens_per_s=e.tokens_per_s, timing=dict(e.timing), grad_norm=e.grad_norm, skipped=e.skipped,
            sample_agreement=e.sample_agreement, completion_len=e.completion_len, eos_share=e.eos_share,
            eval_kl=e.eval_kl, evaluated=e.evaluated, bad_steps=e.bad_steps, epoch=e.epoch,
        ))
        if e.skipped:
            self.bad_steps.append(e.step)
            del self.bad_steps[:-METRICS_KEEP]
        if self.first_metrics is None:
            self.first_metrics = self.metrics[-1]
        if len(self.metrics) > METRICS_KEEP:
            del self.metrics[0]
        if self.step is None or e.step > self.step:
            self.step = e.step

    def _on_stack(self, e: ev.StackEvent) -> None:
        if e.target:
            if e.target in self.stacks:
                self.stacks_prev[e.target] = self.stacks[e.target]
            self.stacks[e.target] = StackRecord(
                dump_id=e.dump_id, method=e.method, ts=e.ts, text=e.text[:STACK_TEXT_KEEP], error=e.error
            )

    def _on_ray(self, e: ev.RayEvent) -> None:
        w = self.workers.get(e.target)  # never creates one: Ray's view is of workers the run knows
        # (nor of an incarnation before the one registered: Ray's news of it may come late)
        if w is not None and not (e.actor_id and w.actor_id and e.actor_id != w.actor_id):
            w.ray_state, w.ray_task, w.ray_task_since, w.ray_death_cause = (
                e.state, e.task, e.task_started, e.death_cause)
            w.ray_required = dict(e.required)

    def _on_ray_node(self, e: ev.RayNodeEvent) -> None:
        self.ray_nodes[e.node or e.node_id] = RayNode(state=e.state, resources=dict(e.resources), ts=e.ts)

    def _on_collectives(self, e: ev.CollectivesEvent) -> None:
        named = {g.group for g in e.groups}
        for group, members in list(self.collectives.items()):
            if group not in named and members.pop(e.src, None) is not None and not members:
                del self.collectives[group]  # it left the group (destroyed, or a new one made)
        for g in e.groups[:MAX_GROUPS]:
            if g.group in self.collectives or len(self.collectives) < MAX_GROUPS * 16:
                self.collectives.setdefault(g.group, {})[e.src] = g

    def _on_engine(self, e: ev.EngineEvent) -> None:
        w = self.workers.get(e.src)
        if w is not None:
            w.engine = e

    def _on_ray_pg(self, e: ev.RayPlacementGroupEvent) -> None:
        if e.state == "REMOVED":
            self.ray_pgs.pop(e.pg_id, None)
            return
        old = self.ray_pgs.get(e.pg_id)
        since = old.since if old is not None and old.state == e.state else (e.created or e.ts)
        self.ray_pgs[e.pg_id] = RayPlacementGroup(name=e.name, state=e.state, strategy=e.strategy,
                                                  bundles=[dict(b) for b in e.bundles], scheduling=e.scheduling,
                                                  since=since, ts=e.ts)

    def _on_alert(self, e: ev.AlertEvent) -> None:
        key = alert_key(e.code, e.targets)
        old = self.alerts.get(key)
        if old is not None:  # the workers it held up are free of it, or are listed again below
            self._unblock(old)
        if e.cleared:
            self.alerts.pop(key, None)
            return
        blocked = e.evidence.get("blocked")
        if e.targets and isinstance(blocked, list):  # (a stranger's alert may carry anything there)
            for b in blocked:
                w = self.workers.get(b) if isinstance(b, str) else None
                if w is not None and not w.blocked_by and b not in e.targets:
                    w.blocked_by = e.targets[0]
        self.alerts[key] = AlertState(
            code=e.code, severity=e.severity, message=e.message, hint=e.hint, targets=list(e.targets),
            since=old.since if old else e.ts, evidence=dict(e.evidence),
        )

    def _unblock(self, a: AlertState) -> None:
        """Free the workers ``a`` held up; one that failed of it stays marked until it starts again (its
        next phase), as a sync's failure marks it."""
        blocked = a.evidence.get("blocked")
        for b in blocked if isinstance(blocked, list) and a.targets else ():
            w = self.workers.get(b) if isinstance(b, str) else None
            if w is not None and w.blocked_by == a.targets[0] and w.phase != "failed":
                w.blocked_by = ""

    def _on_log(self, e: ev.LogEvent) -> None:
        self.logs.append(f"{e.src} {e.level}: {e.message}"[:500])
        if len(self.logs) > 50:
            del self.logs[0]
        if e.level in ("warn", "error") and OOM.search(e.message):
            self._note_oom(e.ts, e.src, e.message)

    def _note_oom(self, ts: float, src: str, line: str) -> None:
        self.oom.append((ts, src, line[:500]))
        del self.oom[:-8]

    def _on_action(self, e: ev.ActionEvent) -> None:
        self.actions.append({"seq": e.seq, "ts": e.ts, "op": e.op, "by": e.by, "ok": e.ok, "result": e.result})
        if len(self.actions) > 50:
            del self.actions[0]

    # --- derived views (pure; `now` comes from the caller) -------------------------------

    def time_in_phase(self, w: WorkerState, now: float) -> float:
        return max(0.0, now - w.phase_since)

    def heartbeat_age(self, w: WorkerState, now: float) -> float | None:
        return max(0.0, now - w.last_heartbeat) if w.last_heartbeat else None

    def workers_by_role(self) -> dict[str, list[WorkerState]]:
        out: dict[str, list[WorkerState]] = {}
        for w in sorted(self.workers.values(), key=lambda w: (w.role, w.rank if w.rank is not None else -1, w.src)):
            out.setdefault(w.role, []).append(w)
        return out

    def stale_workers(self, now: float, stall_s: float) -> list[WorkerState]:
        """Workers whose heartbeats stopped while they were not finished: frozen or dead."""
        return [
            w for w in self.workers.values()
            if w.last_heartbeat and w.phase not in TERMINAL_PHASES and now - w.last_heartbeat > stall_s
        ]

    def sync_view(self, now: float) -> SyncView | None:
        s = self.sync
        if s is None:
            return None
        running = s.state in ("started", "progress")
        elapsed = s.elapsed_s + max(0.0, now - s.last_ts) if running else s.elapsed_s
        # a timeout of no length (or a corrupt one) is no fraction: past its end at once, never infinity
        frac = min(elapsed / s.timeout_s, 1e6) if s.timeout_s > 0 else 0.0
        frac = frac if math.isfinite(frac) else 0.0
        return SyncView(s.sync_id, s.state, elapsed, s.timeout_s, frac, list(s.pending), running)

    def collective_views(self) -> list[CollectiveView]:
        out = []
        for group, members in sorted(self.collectives.items()):
            n = max((p.entered for p in members.values()), default=0)
            if n == 0:
                continue
            at_n = {src: p for src, p in members.items() if p.entered == n}
            left = sorted(src for src, p in at_n.items() if p.left is not None and p.left >= n)
            out.append(CollectiveView(
                group, n, next((p.op for p in at_n.values() if p.op), "collective"),
                max(p.world for p in members.values()), sorted(set(at_n) - set(left)),
                sorted(src for src, p in members.items() if p.entered < n), left,
                min(p.entered_at for p in at_n.values())))
        return out

    def teacher_totals(self) -> TeacherTotals:
        tot = dict.fromkeys(("sent", "completed", "failed", "timed_out", "in_flight", "received", "served",
                             "queue_depth"), 0)
        lat: dict[str, float] = {}
        for key, side in self.teacher.by_src.items():
            for k in tot:
                tot[k] += getattr(side, k)
            if key.startswith("client:"):
                for q, v in side.latency_ms.items():
                    lat[q] = max(lat.get(q, 0.0), v)  # the slowest client is what the run feels
        return TeacherTotals(latency_ms=lat, **tot)

    def teacher_rate(self, window_s: float = 10.0) -> float:
        """Completed teacher requests per second over the last ``window_s`` of history."""
        h = self.teacher.history
        if len(h) < 2:
            return 0.0
        t1, c1 = h[-1]
        for t0, c0 in reversed(h[:-1]):
            if t1 - t0 >= window_s:
                break
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0

    def hung_probes(self, now: float) -> list[tuple[str, str, float]]:
        """(node, probe, seconds not answering) for every probe stuck in a call, growing with ``now``."""
        return [(h.node, h.probe, h.seconds + max(0.0, now - h.at))
                for _, h in sorted(self.probe_hangs.items())]

    def gpu_rows(self) -> list[GpuRow]:
        return [self.gpus[k] for k in sorted(self.gpus)]

    def active_alerts(self) -> list[AlertState]:
        """Most severe first, then oldest first."""
        return sorted(self.alerts.values(), key=lambda a: (SEVERITY_ORDER.get(a.severity, 3), a.since))

    def dump_answer(self, dump_id: str) -> dict | None:
        """The driver's `dump_stacks` action for this dump (its targets and folder), once on record:
        every stack it took is in ``stacks`` by then."""
        for act in reversed(self.actions):
            res = act.get("result")
            if act.get("op") == "dump_stacks" and isinstance(res, dict) and res.get("dump_id") == dump_id:
                return res
        return None

    def recent_metrics(self, n: int = 60) -> list[MetricsPoint]:
        return self.metrics[-n:]


def _rank(text: str) -> int | None:
    """The rank in a src such as ``rollout/2``; None for anything else. ASCII digits only, and few:
    ``str.isdigit`` is true of "²", which int() refuses, and int() refuses 4,300 digits too."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def alert_key(code: str, targets: list[str]) -> str:
    return code + ("@" + ",".join(sorted(targets)) if targets else "")


_HANDLERS = {
    ev.RunEvent: RunState._on_run,
    ev.WorkerEvent: RunState._on_worker,
    ev.PhaseEvent: RunState._on_phase,
    ev.HeartbeatEvent: RunState._on_heartbeat,
    ev.HeartbeatsEvent: RunState._on_heartbeats,
    ev.SyncEvent: RunState._on_sync,
    ev.TeacherEvent: RunState._on_teacher,
    ev.GpuEvent: RunState._on_gpu,
    ev.MetricsEvent: RunState._on_metrics,
    ev.StackEvent: RunState._on_stack,
    ev.AlertEvent: RunState._on_alert,
    ev.LogEvent: RunState._on_log,
    ev.ActionEvent: RunState._on_action,
    ev.RayEvent: RunState._on_ray,
    ev.RayNodeEvent: RunState._on_ray_node,
    ev.RayPlacementGroupEvent: RunState._on_ray_pg,
    ev.CollectivesEvent: RunState._on_collectives,
    ev.EngineEvent: RunState._on_engine,
}

_state_decoder = msgspec.json.Decoder(RunState)


def encode_state(state: RunState) -> bytes:
    return msgspec.json.encode(state)


def decode_state(data: bytes | str) -> RunState:
    return _state_decoder.decode(data)


def replay(lines, skipped: list[tuple[int, str]] | None = None) -> RunState:
    """Rebuild a RunState from the lines of an ``events.jsonl`` (an open file streams). Lines that
    are no event are skipped; with ``skipped``, each one's (line number, why) is added to it."""
    st = RunState()
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            st.apply(ev.decode(line if isinstance(line, bytes) else line.encode()))
        except ev.Rejected as r:
            if skipped is not None:
                skipped.append((n, str(r)))
    return st
