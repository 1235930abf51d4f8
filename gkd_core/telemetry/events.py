"""The event protocol (DESIGN §3): typed events, one JSON object each (their codec: ``wire``).

Every event carries the envelope ``v, seq, ts, run, src, kind``; the payload fields sit beside it
in the same flat object. On ZeroMQ an event travels as the multipart ``[kind, json]`` so that a
SUB socket can filter by kind. ``seq`` and ``run`` are stamped by the supervisor.
"""

from __future__ import annotations

from typing import Any, Union, cast

import msgspec

from gkd_core.telemetry.answers import Answer, AnyAnswer, Receipt

# the heartbeat's parts, and the 64-bit integers every event's numbers are (their own module: ``beats``)
from gkd_core.telemetry.beats import FULL_BEAT_S as FULL_BEAT_S
from gkd_core.telemetry.beats import INT64 as INT64
from gkd_core.telemetry.beats import Beat as Beat
from gkd_core.telemetry.beats import GpuReading as GpuReading
from gkd_core.telemetry.beats import Int as Int
from gkd_core.telemetry.beats import MemoryBeat as MemoryBeat
from gkd_core.telemetry.beats import RelayClock as RelayClock

PROTOCOL_VERSION = 1
MAX_EVENT_BYTES = 1 << 20  # 1 MiB: larger frames are dropped and counted as "oversized"
MAX_DEPTH = 32  # arrays and objects within one another in an event (real ones: 3 at most)

ENVELOPE = ("v", "seq", "ts", "run", "src", "kind")


class Event(msgspec.Struct, kw_only=True, tag_field="kind"):
    v: Int = PROTOCOL_VERSION
    seq: Int = 0
    ts: float = 0.0
    run: str = ""
    src: str = ""

    @property
    def kind(self) -> str:
        return cast(str, self.__struct_config__.tag)  # every kind's tag is a string, given below


class RunEvent(Event, tag="run"):
    state: str  # starting, running, restarting, finished, failed, stopped
    config_digest: str = ""
    restart: Int = 0
    exit_code: Int | None = None
    reason: str = ""
    total_steps: Int | None = None
    log_tail: list[str] = []
    heartbeat_s: float | None = None  # how often workers send a heartbeat
    heartbeat_log_s: float | None = None  # a quiet worker's heartbeat is logged this often (0: every one)


class WorkerEvent(Event, tag="worker"):
    role: str = ""
    rank: Int | None = None
    node: str = ""
    pid: Int = 0
    gpus: list[Int] = []
    actor_id: str = ""
    via: str = ""  # the relay its events go through (``agent/<node>``); "" when they go straight
    # its driver starts it again in its place when it dies, and the run goes on: the recovery stops a frozen one
    # (``cancel`` with force) rather than restart the whole run
    replaceable: bool = False


class PhaseEvent(Event, tag="phase"):
    phase: str
    step: Int | None = None
    started: float | None = None
    deadline: float | None = None
    detail: str = ""
    # the how-manieth call of this method on this worker (an actor's method, a verl worker's); with
    # no step, the same call number on peers is the same instance of the phase (the straggler rule)
    call: Int | None = None
    # the actor calls this phase waits on that have not answered, as ``Worker.method`` (a ``ray.get`` on
    # them): the wait-for graph's edges out of this worker (``diagnosis.rules.waits``); at most WAITS_ON_MAX
    waits_on: list[str] = []
    # calls of this worker in flight at once (an async actor's, a threaded actor's), when more than one: the
    # phase is then the oldest of them, ``started`` its start and ``call`` its number
    in_flight: Int = 0
    # the most memory (RSS, with its children's) the phase this one ends reached, as the reporter's heartbeats
    # saw it (0: not known): each phase's peak in the phase history, "sync_weights peaks at 2.1x train"
    peak_rss: Int = 0


WAITS_ON_MAX = 32
SENDS_MAX = 64  # a SendsEvent's calls


class HeartbeatEvent(Event, tag="heartbeat"):
    phase: str = ""
    elapsed: float = 0.0  # seconds in the current phase
    rss: Int = 0  # bytes, its child processes' included where its CPU is (proctree)
    cpu: float = 0.0  # percent of one core since the last heartbeat, its child processes' included (proctree)
    dropped: Int = 0  # events this process could not send (queue full or supervisor away)
    mem: MemoryBeat | None = None  # None: not read (an older sender, or nothing readable)


class OomKilledEvent(Event, tag="oom_killed"):
    """A worker that fell silent or died while the OOM killer's count in its memory scope went up since its
    last heartbeat: killed by the kernel for memory, not a plain death. Said by whoever can read the scope
    (the supervisor, on the worker's node) once, with the count before and after."""

    worker: str
    scope: str
    kills_before: Int
    kills_after: Int


def beat_of_event(e: HeartbeatEvent) -> Beat:
    return Beat(e.src, e.ts, e.phase, e.elapsed, e.rss, e.cpu, e.dropped, e.mem)


def event_of_beat(b: Beat, **fields: Any) -> HeartbeatEvent:
    """``fields``: the event's own (its ``run``, ``seq``) where the beat's batch had them."""
    return HeartbeatEvent(src=b.src, ts=b.ts, phase=b.phase, elapsed=b.elapsed, rss=b.rss, cpu=b.cpu,
                          dropped=b.dropped, mem=b.mem, **fields)


class HeartbeatsEvent(Event, tag="heartbeats"):
    """The heartbeats of one node's workers over one interval, as one message: what its relay (the node agent)
    received since it last sent one, the newest of each worker. At 65,536 workers, 8 to a node, that is 8,192
    messages a second instead of 65,536. ``src`` is the relay; in ``events.jsonl``, the supervisor's (``node``
    empty): the heartbeats it keeps, of any node.

    ``beats``: in full, only a worker's beat that says something its last full one did not (``relay.same_beat``),
    and one at least every ``FULL_BEAT_S``; the others are a sign of life only, which ``clocks`` says for all of a
    relay's workers at once (``RelayClock``): a worker's newest heartbeat is its relay's clock while that vouches
    for it (``state.views.heartbeat_at``). A batch merged by the supervisor holds the clocks of every relay whose
    batch it took in; the log keeps a relay's clock a few times a minute, and each change of its roster."""

    node: str = ""
    beats: list[Beat] = []
    clocks: list[RelayClock] = []


class SyncEvent(Event, tag="sync"):
    sync_id: Int
    state: str  # started, progress, done, timed_out, failed, cancelled
    timeout_s: float = 0.0
    elapsed_s: float = 0.0
    pending: list[str] = []
    done: list[str] = []
    fingerprint_ok: bool | None = None
    differ: list[str] = []  # done: the members whose weights' fingerprint is not the student's
    error: str = ""
    step: Int | None = None
    # failed: the members that failed or cannot finish only because a pending one died (victims, not causes)
    blocked: list[str] = []


class SyncPartEvent(Event, tag="sync_part"):
    """One member's part of a weight sync (vocab.SYNC_PARTS: gather, broadcast, load into the engine ...),
    begun or ended, said by the member itself: the sync's own events say who is pending, these say where
    each member is in it, so that the slow part is named with its usual time."""

    sync_id: Int
    part: str
    state: str = "began"  # began, ended
    step: Int | None = None
    started: float | None = None  # ended: when it began (a reader that missed the beginning still has its length)


class CollectiveProgress(msgspec.Struct, kw_only=True, omit_defaults=True):
    group: str  # the process group's description or name ("weight_sync", "default_pg")
    rank: Int  # this process's rank in it
    world: Int  # its size
    entered: Int = 0  # the sequence number of the last collective this rank entered (0: none yet)
    op: str = ""  # its op ("broadcast")
    nbytes: Int = 0
    entered_at: float = 0.0
    left: Int | None = 0  # the last it left (completed); None where the source cannot tell (gloo, Flight Recorder)
    left_at: float = 0.0
    source: str = "gkd"  # "gkd" (our wrappers) or "flight_recorder"


class CollectivesEvent(Event, tag="collectives"):
    """Where this process stands in each of its process groups (telemetry/collectives.py), sent by its
    Reporter at a heartbeat when it changed."""

    groups: list[CollectiveProgress] = []


class TeacherEvent(Event, tag="teacher"):
    side: str = "client"  # client or server
    sent: Int = 0
    completed: Int = 0
    failed: Int = 0
    timed_out: Int | msgspec.UnsetType = msgspec.UNSET  # omitted until the first: a grep finds those that say one
    in_flight: Int = 0
    received: Int = 0
    served: Int = 0
    queue_depth: Int = 0
    workers: dict[str, Int] = {}  # served per server worker
    errors: dict[str, Int] = {}  # of those, answered with an error, per server worker
    latency_ms: dict[str, float] = {}  # p50, p95, p99


class GpuEvent(Event, tag="gpu"):
    node: str = ""
    index: Int = 0
    uuid: str = ""
    util: float | None = None
    mem_used: Int | None = None
    mem_total: Int | None = None
    temp: float | None = None
    power: float | None = None
    pids: list[Int] = []
    proc_mem: dict[str, Int] = {}  # pid (as text, as JSON's keys are) -> the GPU memory it holds, where NVML says
    nvml_hung_s: float | None = None  # a probe whose call has not returned: seconds since it began, growing
    probe: str = "nvml"  # which probe: nvml or nvidia-smi
    error: str = ""  # with index -1, a note about the node, not a GPU ("no NVIDIA driver on this node")


class GpusEvent(Event, tag="gpus"):
    """A node's GPU readings of one sample (``GpuReading``: a ``gpu`` event's, at the batch's node and time), those
    new since the last sent (``node.gpu_deadband``): a message a node, not 65,536 ``gpu`` a second."""

    node: str = ""
    readings: list[GpuReading] = []


class MetricsEvent(Event, tag="metrics"):
    step: Int
    loss: float | None = None
    kl: float | None = None
    agreement: float | None = None
    tokens_per_s: float | None = None
    timing: dict[str, float] = {}
    grad_norm: float | None = None  # before clipping; NaN or inf on a bad step
    skipped: bool = False  # the step's loss or gradient was not finite: not applied, synced nor saved
    bad_steps: Int = 0  # skipped steps so far in this incarnation of the driver
    # on the step's own samples: top-1 agreement with the teacher per completion token, mean
    # completion length in tokens (EOS included), the share of completions that reached EOS
    sample_agreement: float | None = None
    completion_len: float | None = None
    eos_share: float | None = None
    # `agreement` and `eval_kl` are the newest evaluation's (held-out prompts, greedy completions);
    # `evaluated`: this step ran it
    eval_kl: float | None = None
    evaluated: bool = False
    data_position: Int | None = None  # prompts handed out so far, this step's included
    epoch: float | None = None  # data_position over the number of training prompts


class EngineEvent(Event, tag="engine"):
    """A worker's inference engine (a rollout's, a teacher's), as the engine counts itself (vLLM's own
    metrics), sent when it changed, at most once a second: what is running and waiting, and how full
    the KV cache is."""

    # each count None where the engine has no metric for it (renamed by another version): unknown, not 0
    engine: str = ""  # vllm
    running: Int | None = 0  # requests being generated
    waiting: Int | None = 0  # requests queued (no room in the KV cache, or past the batch's limit)
    kv_cache: float | None = None  # the share of the KV cache in use, 0 to 1
    preemptions: Int | None = 0  # requests evicted for lack of KV cache since the engine started
    generated: Int | None = 0  # tokens generated since the engine started


class SendsEvent(Event, tag="sends"):
    """The actor calls a worker sent lately, ``Worker.method`` (the newest ``SENDS_MAX``), when they changed:
    who feeds a queue, who opens a gate. A call that waits on data (``vocab.DataWait``) waits on whoever calls
    the methods that set it, which only the callers know (Ray tells a callee nothing of its caller)."""

    to: list[str] = []  # at most SENDS_MAX


class QueueDepth(msgspec.Struct, array_like=True):
    """A queue of the job's in a worker, as a ``flow`` event says it: ``[name, depth, puts, behind]``: what the
    job calls it (``MessageQueue.samples``: its holder's class and attribute), its length now, the puts seen
    into it since the process began (a put, a Condition notified over it), and, where its samples say their
    policy's version, the samples taken out of it since then by how many versions they were behind the newest
    put into it (``behind[i]``: i versions; the last, that many or more; empty: no versions seen)."""

    name: str
    depth: Int
    puts: Int
    behind: list[Int] = []  # at most STALENESS_BUCKETS


STALENESS_BUCKETS = 6  # a sample 0, 1, 2, 3, 4, or 5 and more versions behind


class FlowEvent(Event, tag="flow"):
    """What went through a worker lately, every few seconds while it changed: the calls of each of its methods
    begun since it started (the ``FLOW_CALLS_MAX`` most called) and its queues' depths. A rate is the
    difference of two (the pipeline pane's produced and consumed per second)."""

    calls: dict[str, Int] = {}
    queues: list[QueueDepth] = []  # at most FLOW_QUEUES_MAX
    serves: list[str] = []  # the host:port its served requests came to (FLOW_SERVES_MAX): a request to one is to it


FLOW_CALLS_MAX = 32
FLOW_QUEUES_MAX = 8
FLOW_SERVES_MAX = 8


class StackEvent(Event, tag="stack"):
    dump_id: str = ""
    target: str = ""
    method: str = ""  # in-process, faulthandler, py-spy
    text: str = ""
    error: str = ""


class AlertEvent(Event, tag="alert"):
    severity: str = "warn"  # info, warn, critical
    code: str = ""
    message: str = ""
    hint: str = ""
    targets: list[str] = []
    evidence: dict[str, Any] = {}  # the numbers behind it: elapsed, the peers' median, CPU, the verdict
    cleared: bool = False



class LogEvent(Event, tag="log"):
    level: str = "info"
    message: str = ""


class RayEvent(Event, tag="ray"):
    """What Ray's state API says of a worker's actor: a second view beside the worker's own."""

    target: str = ""  # the worker's src
    actor_id: str = ""
    state: str = ""  # ALIVE, PENDING_CREATION, RESTARTING, DEAD
    task: str = ""  # the method Ray is running on it now; "" when none
    task_started: float | None = None
    death_cause: str = ""
    required: dict[str, float] = {}  # what the actor asks for (CPU, GPU, custom), while Ray cannot place it


class RayNodeEvent(Event, tag="ray_node"):
    """A Ray node and what it has: whether a pending actor's demand can be met anywhere."""

    node: str = ""  # its IP
    node_id: str = ""
    state: str = ""  # ALIVE, DEAD
    resources: dict[str, float] = {}  # resources_total


class RayPlacementGroupEvent(Event, tag="ray_pg"):
    """A Ray placement group and what it asks for: whether a pool that never starts can ever be placed."""

    pg_id: str = ""
    name: str = ""
    state: str = ""  # PENDING, CREATED, RESCHEDULING, REMOVED
    strategy: str = ""  # PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
    bundles: list[dict[str, float]] = []
    scheduling: str = ""  # Ray's word for a pending one, where it says: INFEASIBLE, NO_RESOURCES, ...
    created: float | None = None  # when Ray took the request, where it says


class ActionEvent(Event, tag="action"):
    """An op carried out, or refused: a request's answer (``telemetry/answers``), or the supervisor's own act."""

    op: str = ""
    by: str = ""
    ok: bool = True
    result: AnyAnswer | str | None = None  # the answer; a refusal's or a failure's text
    # the control request it answers (its id): the supervisor's answer, and a driver's outcome that comes
    # later (a cancel's, a dump's); 0 for what nobody asked (the diagnosis's own dumps)
    request: int = 0

    @property
    def is_receipt(self) -> bool:
        """A supervisor's receipt for a request it handed on (to the driver, to its stack taker): the answer
        is to come."""
        return isinstance(self.result, Receipt)

    @property
    def result_said(self) -> str:
        """The answer in a person's words, or the refusal's text."""
        return self.result.said() if isinstance(self.result, Answer) else str(self.result or "")

    def said(self) -> str:
        """``cancel: sync 4 cancelled …`` or ``cancel failed: no weight sync is under way …``."""
        return f"{self.op}{'' if self.ok else ' failed'}: {self.result_said}"


# every kind defined above (one left out of a hand-kept list would decode as unknown: the reducer never saw it)
KNOWN = tuple(Event.__subclasses__())
# the union of a tuple made at run time, for msgspec's decoders: `X | Y` cannot spell it
AnyEvent = Union[KNOWN]  # type: ignore[valid-type]  # noqa: UP007
KINDS: dict[str, type[Event]] = {cast(str, cls.__struct_config__.tag): cls for cls in KNOWN}


class UnknownEvent(msgspec.Struct, kw_only=True):
    """A kind this reader does not know: kept whole (a newer writer's), ignored by the reducer."""

    kind: str
    seq: int = 0
    ts: float = 0.0
    src: str = ""
    fields: dict[str, Any] = {}
