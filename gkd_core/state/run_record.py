"""``RunRecord``: what the run is now, field by field, and the few steps every reducer case takes (a worker
first heard of, a worker that moved). The reducer's cases (``reducer``, ``sync_cases``, ``memory_cases``)
change a ``RunRecord``; ``views`` derives from it; ``run_state.RunState`` is the whole: these, the views
and ``apply``."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TypeVar

import msgspec

from gkd_core.state.feed import Feed, ScopeFeed
from gkd_core.state.records import (
    SPANS_KEEP,
    AlertState,
    GpuRow,
    LogLine,
    MetricsPoint,
    ProbeHang,
    RayNode,
    RayPlacementGroup,
    ScopeMemory,
    StackRecord,
    SyncState,
    TeacherState,
    WorkerState,
)
from gkd_core.state.series import Series
from gkd_core.telemetry import events as ev
from gkd_core.vocab import WorkerId

Kept = TypeVar("Kept")


# (dict: what the diagnosis keeps of a state between passes lives in its __dict__, which is never encoded: a
# snapshot, a keyframe or a replay is a new state whose indexes are made anew)
class RunRecord(msgspec.Struct, kw_only=True, weakref=True, dict=True):
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
    actions: list[ev.ActionEvent] = []  # the last few actions (requests answered, the supervisor's), newest last
    recovery: str = ""  # the recovery policy and where it stands, as said (supervisor/recovery.py); "": off
    stacks: dict[str, StackRecord] = {}  # target -> its newest stack
    stacks_prev: dict[str, StackRecord] = {}  # target -> the one before: is it stuck in the same place?
    logs: list[LogLine] = []  # the last few `log` events
    # out-of-memory lines of this incarnation of the driver: (ts, src, line); a new driver starts afresh
    oom: list[tuple[float, str, str]] = []
    # process group -> member -> where it stands in the group's collectives (its newest `collectives` event)
    collectives: dict[str, dict[str, ev.CollectiveProgress]] = {}
    # process group -> the times its ranks spent inside its collectives lately (entered to left, where the source
    # says it left): how long a wait in one usually is
    collective_inside: dict[str, list[float]] = {}
    # the workers whose phase waits on others (``WorkerState.waits_on`` not empty): the wait-for graph's
    # waiters, found without a look at every worker each pass (65,536 of them at the largest)
    waiting: set[str] = set()
    # the workers that said what went through them or whom they call (``flow``, ``sends``): a pipeline's, its
    # pane's rows found without a look at every worker each redraw
    in_pipeline: set[str] = set()
    series: Series = msgspec.field(default_factory=Series)  # what the plots draw besides `metrics`
    mem_scopes: dict[str, ScopeMemory] = {}  # "node|scope" -> its memory (memory_cases)
    # each relay's clock as its newest batch said it: [epoch, ts] (the workers it vouches for: their clock_via)
    relay_clocks: dict[str, tuple[float, float]] = {}
    # how far past a worker's newest full beat its relay's clock is taken for it (``views.heartbeat_at``):
    # the run's periods set it (``vouch_s``); this default is theirs by default
    vouch_s: float = 23.0
    heartbeat_s: float = 1.0  # how often its workers send a heartbeat, as the run said (liveness.Limits)
    # the newest heartbeat or relay's clock of any process: are others heard from while one is silent
    # (``liveness.others_heard``), without a walk over every worker
    newest_beat: float = 0.0

    def worker_seen(self, src: str, ts: float) -> WorkerState:
        """The worker ``src`` (made when first heard of), last seen at ``ts`` or later."""
        w = self.workers.get(src)
        if w is None:
            role, rank = WorkerId.parse(src)
            w = WorkerState(src=src, role=role, rank=rank, phase_since=ts)
            self.workers[src] = w
            self.touch(w)  # (to every feed: new workers come to each in the state's order)
        if ts > w.last_seen:
            w.last_seen = ts
        return w

    def keep_spans(self, n: int) -> None:
        """From now on keep ``n`` finished phases per worker (and no more of those kept so far)."""
        self.spans_keep = n
        for w in self.workers.values():
            if len(w.spans) > n:
                w.spans = w.spans[len(w.spans) - n:] if n else []
                self.mark_moved(w)

    def mark_moved(self, w: WorkerState) -> None:
        """``w``'s role, phase or spans changed: fed to the indexes that want those (``touch``)."""
        self.touch(w, moved=True)

    def touch(self, w: WorkerState, moved: bool = False) -> None:
        """``w`` changed in something the diagnosis's indexes keep: each index's feed of this state has it (a
        change of phase, spans or role (``moved``) only the feeds that want those)."""
        feeds = self.__dict__.get("_feeds")
        if feeds:
            for ref in feeds:
                feed = ref()
                if feed is not None and (feed.moves or not moved):
                    feed.add(w)

    def feed(self, moves: bool = True) -> Feed:
        """A new feed of the workers this state's reducer changes from now on (``touch``), their phases' changes
        too unless not ``moves``; it lives as long as whoever takes from it holds it."""
        feeds = self.__dict__.setdefault("_feeds", [])
        feeds[:] = [ref for ref in feeds if ref() is not None]
        feed = Feed(moves)
        feeds.append(weakref.ref(feed))
        return feed

    def touch_scope(self, key: str, reading: ScopeMemory | None, made: bool = False) -> None:
        """The memory scope ``key`` (``mem_scopes``) has a new ``reading`` (``made``: its first), or is gone (None):
        each scope feed has it, if it wants it (``ScopeFeed``)."""
        feeds = self.__dict__.get("_scope_feeds")
        if feeds:
            for ref in feeds:
                feed = ref()
                if feed is not None and (reading is None or made or not feed.made_only
                                         and (feed.wants is None or feed.wants(reading))):
                    feed.add(key)

    def scope_feed(self, wants: Callable[[ScopeMemory], bool] | None = None, made_only: bool = False) -> ScopeFeed:
        """A new feed of the memory scopes made, let go or read from now on (``touch_scope``): the readings that
        ``wants`` (None: every one), or none (``made_only``)."""
        feeds = self.__dict__.setdefault("_scope_feeds", [])
        feeds[:] = [ref for ref in feeds if ref() is not None]
        feed = ScopeFeed(wants, made_only)
        feeds.append(weakref.ref(feed))
        return feed

    def touch_gpu(self, key: str) -> None:
        """The GPU ``key`` (``gpus``) has a new reading: each GPU feed has it (``gpu_feed``)."""
        for ref in self.__dict__.get("_gpu_feeds", ()):
            feed = ref()
            if feed is not None:
                feed.add(key)

    def gpu_feed(self) -> ScopeFeed:
        """A new feed of the GPUs read from now on (``touch_gpu``), by their keys in ``gpus``."""
        feeds = self.__dict__.setdefault("_gpu_feeds", [])
        feeds[:] = [ref for ref in feeds if ref() is not None]
        feed = ScopeFeed()
        feeds.append(weakref.ref(feed))
        return feed

    def backlog(self) -> int:
        """What this state's feeds hold that their indexes have not taken in yet (``diagnosis.keep_up``)."""
        n = 0
        for ref in (*self.__dict__.get("_feeds", ()), *self.__dict__.get("_scope_feeds", ()),
                    *self.__dict__.get("_gpu_feeds", ())):
            feed = ref()
            if feed is not None:
                n += len(feed)
        return n

    def kept_if(self, name: str) -> object | None:
        """What the diagnosis keeps under ``name``, if it made it (``kept``)."""
        return self.__dict__.get(name)

    def kept(self, name: str, make: Callable[[], Kept]) -> Kept:
        """What the diagnosis keeps of this state between its passes under ``name`` (an index), made at first
        ask; it lives as long as the state (never encoded: a decoded state makes its own)."""
        got: Kept | None = self.__dict__.get(name)
        if got is None:
            got = self.__dict__.setdefault(name, make())
        return got
