"""What a run's state is made of: a worker, a sync, the teacher, a GPU, an alert, a stack, a step's
metrics; and the bounds on what it keeps."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gkd_core.telemetry import events as ev
from gkd_core.vocab import CPU_IDLE_PCT as CPU_IDLE_PCT  # (the state's word for it, as before)

METRICS_KEEP = 512
SYNC_HISTORY_KEEP = 32
MAX_GROUPS = 64  # process groups a member may report (a job makes a few: world, data parallel, tensor parallel ...)
TEACHER_HISTORY_KEEP = 120
IDLE_MARK_S = 10.0
IDLE_MARKS_KEEP = 8
FLOWS_KEEP = 8  # a worker's newest ``flow`` events (one every few seconds while it changes): its rates' window
STACK_TEXT_KEEP = 64 * 1024
# what an out-of-memory error says: CUDA's, torch's, the kernel's OOM killer, Ray's memory monitor
# (not a bare "OOM": Ray's message for any dead worker lists "the OOM killer" among possible causes)
OOM = re.compile(r"out of memory|OutOfMemoryError|\bOOM[- ]?(?:killed|error)|oom-kill|Killed process|"
                 r"running low on memory|Failed to allocate memory for KV cache", re.IGNORECASE)
SPANS_KEEP = 16  # finished phases remembered per worker: its peers' times and its own history


class PhaseSpan(msgspec.Struct, array_like=True):
    """One finished phase of a worker: what, at which step, from when to when."""

    phase: str
    step: int | None
    started: float
    ended: float
    call: int | None = None  # the call number, for a method (PhaseEvent.call)
    peak_rss: int = 0  # the most memory it reached (PhaseEvent.peak_rss; 0: not known)


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
    last_heartbeat: float = 0.0  # its newest full heartbeat (or quiet word); its newest at all: views.heartbeat_at
    clock_via: str = ""  # the relay whose clock vouches for it (its roster's: RelayClock), "" when none
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
    waits_on: list[str] = []  # the calls its phase waits on, ``Worker.method`` (PhaseEvent.waits_on)
    waits_since: float = 0.0  # when ``waits_on`` last changed: a wait-for cycle that has not moved since
    sends: list[str] = []  # the actor calls it sent lately, ``Worker.method`` (SendsEvent): whom it feeds
    # its calls in flight at once, when more than one (PhaseEvent.in_flight): its phase is then the oldest's
    in_flight: int = 0
    spans: list[PhaseSpan] = []  # finished phases, oldest first
    cpu_low_since: float | None = None  # every heartbeat since then under CPU_IDLE_PCT
    via: str = ""  # the relay its events go through (its node's agent), "" when they go straight
    replaceable: bool = False  # its driver starts it again in its place when it dies (WorkerEvent.replaceable)
    # the worker whose death made this one fail (a sync's `blocked`): a victim, not a cause; until it
    # starts something new
    blocked_by: str = ""
    ended_in: str = ""  # the phase it was in when the run ended (its phase is then "exited")
    engine: ev.EngineEvent | None = None  # its inference engine's own counts (vLLM), the newest
    flows: list[ev.FlowEvent] = []  # what went through it (its calls, its queues), the newest FLOWS_KEEP
    # the seconds it spent idle or waiting on others (a phase of ``idle``, or ``waits_on`` not empty) up to
    # ``idle_from``'s stretch, and when that stretch began (None: working now): its idle share (the pipeline)
    idle_s: float = 0.0
    idle_from: float | None = None
    # (ts, its idle seconds then), one every IDLE_MARK_S, the newest IDLE_MARKS_KEEP, for a worker that sends
    # calls (a pipeline's stage): its idle share over the last minute is the difference from one of them
    idle_marks: list[tuple[float, float]] = []
    # memory: its scope's (the newest heartbeat's), and the OOM killer's kill of it where one was found
    mem: ev.MemoryBeat | None = None
    oom_killed: ev.OomKilledEvent | None = None


class ScopeMemory(msgspec.Struct, kw_only=True):
    """A memory scope of a node (a cgroup with a limit, or the node itself): its use and limit as the newest
    heartbeat from it said (its growth is learned by the diagnosis: diagnosis/memory_growth)."""

    node: str
    scope: str
    used: int = 0
    limit: int = 0
    available: int = 0  # the node's MemAvailable
    oom_kills: int | None = None
    ts: float = 0.0


class SyncPartNow(msgspec.Struct, array_like=True):
    """Where one member is in a sync: the part it began (vocab.SYNC_PARTS) and when."""

    part: str
    since: float


class SyncState(msgspec.Struct, kw_only=True):
    sync_id: int
    state: str
    started: float
    timeout_s: float = 0.0
    elapsed_s: float = 0.0
    last_ts: float = 0.0
    pending: list[str] = []
    done: list[str] = []
    members: list[str] = []  # every member the driver named in it, pending or done (its start names them all)
    fingerprint_ok: bool | None = None
    differ: list[str] = []
    error: str = ""
    step: int | None = None
    parts_now: dict[str, SyncPartNow] = {}  # member -> the part it is in (``sync_part`` events), until it ends it
    parts_took: dict[str, float] = {}  # part -> the longest any member took in it: the sync's time, split


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
    errors: dict[str, int] = {}  # server: of each worker's answers, those that were an error
    # server: a worker whose every answer since was an error: (when that began, how many, when the last came)
    error_streaks: dict[str, tuple[float, int, float]] = {}
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
    proc_mem: dict[str, int] = {}  # pid (as text) -> the GPU memory it holds here (GpuEvent.proc_mem)
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


class LogLine(msgspec.Struct, kw_only=True):
    """A line a process of the run logged (a ``log`` event), kept whole: who, how loud, what, when."""

    src: str
    level: str
    text: str
    ts: float = 0.0

    def said(self) -> str:
        return f"{self.src} {self.level}: {self.text}"


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



def alert_key(code: str, targets: list[str]) -> str:
    return code + ("@" + ",".join(sorted(targets)) if targets else "")
