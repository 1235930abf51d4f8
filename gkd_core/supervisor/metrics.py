"""``/metrics`` for Prometheus: a run as the clusters' scrapers read it, written with prometheus_client.

Names by the ecosystem's conventions (``gkd_`` first, the unit last, ``_total`` for counters): each worker's
phase and seconds in it, its heartbeat's age, step and memory; the run's step and restarts; the current
sync's elapsed time against its timeout; the teacher's requests; each GPU's use and memory; each memory
scope against its limit; each pipeline queue's depth; every active alert (by code, severity and target); and
the supervisor's own events taken in. A scrape's size is bounded, whatever the run's: per-worker series for
at most ``WORKERS_MAX`` workers (the workers an alert names always among them), and beyond that a series per
role and phase (how many, the longest in it); as many GPUs and memory scopes, with every GPU counted:
65,536 workers are not a 65,536-series scrape.

The families are made on the supervisor's loop (the only thread that reads its state: ``Scrapes``), when a
scrape asks, and handed to the HTTP server's thread, which waits for them ``ASK_DEADLINE_S`` at most.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gkd_core.state import RunState
from gkd_core.state.views import heard_from
from gkd_core.vocab import WORKER_ENDED

WORKERS_MAX = 256  # workers with series of their own; beyond, per role and phase
ASK_DEADLINE_S = 2.0  # a scrape waits this long for the loop's families, then answers without them
ALERT_TARGETS_MAX = 64  # per alert: its first targets, a series each
GPUS_MAX = 256  # GPUs with series of their own; every GPU counted (busy, idle, unread) and in the mean
SCOPES_MAX = 256  # memory scopes with series of their own: the nearest their limits


@dataclass
class SupervisorCounts:
    """The supervisor's own numbers a scrape says (its loop keeps them)."""

    events: int = 0  # taken in, its own among them
    rejected: int = 0  # refused at the ingest (malformed, too large, unknown sender)
    alert_pass_s: float = 0.0  # its newest alerts' pass


def families(st: RunState, now: float, counts: SupervisorCounts, workers_max: int = WORKERS_MAX) -> list[Metric]:
    """Every family of one scrape, from the state as it is at ``now``."""
    out: list[Metric] = []
    out += _run(st, counts)
    out += _workers(st, now, workers_max)
    out += _sync(st, now)
    out += _teacher(st)
    out += _gpus(st)
    out += _memory(st)
    out += _queues(st)
    out += _alerts(st)
    return out


def _run(st: RunState, counts: SupervisorCounts) -> list[Metric]:
    info = GaugeMetricFamily("gkd_run_info", "The run: its id and state (always 1)", labels=["run", "state"])
    info.add_metric([st.run, st.state or "unknown"], 1)
    step = GaugeMetricFamily("gkd_run_step", "The newest training step any worker reported")
    if st.step is not None:
        step.add_metric([], st.step)
    restarts = CounterMetricFamily("gkd_run_restarts", "Times the run's driver was started again")
    restarts.add_metric([], st.restarts)
    events = CounterMetricFamily("gkd_supervisor_events", "Events the supervisor took in (its own among them)")
    events.add_metric([], counts.events)
    rejected = CounterMetricFamily("gkd_supervisor_rejected_events", "Events refused at the ingest")
    rejected.add_metric([], counts.rejected)
    alert_pass = GaugeMetricFamily("gkd_supervisor_alert_pass_seconds", "The newest pass of the diagnosis's rules")
    alert_pass.add_metric([], counts.alert_pass_s)
    return [info, step, restarts, events, rejected, alert_pass]


def _workers(st: RunState, now: float, workers_max: int) -> list[Metric]:
    by_phase = GaugeMetricFamily("gkd_workers", "Workers by role and phase", labels=["role", "phase"])
    longest = GaugeMetricFamily("gkd_role_phase_seconds_max", "The longest any worker of a role has been in its "
                                "phase", labels=["role", "phase"])
    groups: dict[tuple[str, str], list] = {}  # (role, phase) -> [how many, the oldest phase start]
    for w in st.workers.values():  # (the one walk of every worker: as little as can be done in it)
        group = groups.get((w.role, w.phase))
        if group is None:
            groups[(w.role, w.phase)] = [1, w.phase_since]
        else:
            group[0] += 1
            if w.phase_since < group[1]:
                group[1] = w.phase_since
    for (role, phase), (n, oldest) in sorted(groups.items()):
        by_phase.add_metric([role, phase or "unknown"], n)
        longest.add_metric([role, phase or "unknown"], round(max(0.0, now - oldest), 3) if oldest else 0)
    named = {t for a in st.active_alerts() for t in a.targets[:ALERT_TARGETS_MAX] if t in st.workers}
    # past the limit, the named and then the first come (the same ones from one scrape to the next, no sort of
    # every name: at 65,536 workers that alone was most of a scrape)
    own = sorted(named) + list(itertools.islice((src for src in st.workers if src not in named),
                                                max(0, workers_max - len(named)))) \
        if len(st.workers) > workers_max else sorted(st.workers)
    phase_s = GaugeMetricFamily("gkd_worker_phase_seconds", "Seconds a worker has been in its phase",
                                labels=["worker", "role", "phase"])
    beat_age = GaugeMetricFamily("gkd_worker_heartbeat_age_seconds", "Seconds since a worker was last heard from",
                                 labels=["worker"])
    step = GaugeMetricFamily("gkd_worker_step", "The training step a worker reported last", labels=["worker"])
    rss = GaugeMetricFamily("gkd_worker_resident_memory_bytes", "A worker's resident memory with its children's",
                            labels=["worker"])
    for src in own:
        w = st.workers[src]
        phase_s.add_metric([src, w.role, w.phase or "unknown"], round(now - w.phase_since, 3) if w.phase_since else 0)
        if w.phase not in WORKER_ENDED and (heard := heard_from(st, w)):
            beat_age.add_metric([src], round(max(0.0, now - heard), 3))
        if w.step is not None:
            step.add_metric([src], w.step)
        if w.rss:
            rss.add_metric([src], w.rss)
    return [by_phase, longest, phase_s, beat_age, step, rss]


def _sync(st: RunState, now: float) -> list[Metric]:
    elapsed = GaugeMetricFamily("gkd_sync_elapsed_seconds", "The current (or last) weight sync's time so far")
    timeout = GaugeMetricFamily("gkd_sync_timeout_seconds", "The current weight sync's timeout")
    pending = GaugeMetricFamily("gkd_sync_pending_members", "Members of the current sync that have not finished")
    view = st.sync_view(now)
    if view is not None:
        elapsed.add_metric([], round(view.elapsed_s, 3))
        timeout.add_metric([], view.timeout_s)
        pending.add_metric([], len(view.pending) if view.running else 0)
    return [elapsed, timeout, pending]


def _teacher(st: RunState) -> list[Metric]:
    t = st.teacher_totals()
    out: list[Metric] = []
    for name, value, what in (("sent", t.sent, "sent by the clients"), ("completed", t.completed, "answered"),
                              ("failed", t.failed, "failed"), ("timed_out", t.timed_out, "timed out"),
                              ("received", t.received, "received by the servers")):
        c = CounterMetricFamily(f"gkd_teacher_requests_{name}", f"Teacher requests {what}")
        c.add_metric([], value)
        out.append(c)
    in_flight = GaugeMetricFamily("gkd_teacher_requests_in_flight", "Teacher requests sent and not answered")
    in_flight.add_metric([], t.in_flight)
    queue = GaugeMetricFamily("gkd_teacher_queue_depth", "Requests waiting at the teacher's servers")
    queue.add_metric([], t.queue_depth)
    return [*out, in_flight, queue]


def _gpus(st: RunState) -> list[Metric]:
    util = GaugeMetricFamily("gkd_gpu_utilization_ratio", "A GPU's utilisation, 0 to 1", labels=["node", "gpu"])
    used = GaugeMetricFamily("gkd_gpu_memory_used_bytes", "A GPU's memory in use", labels=["node", "gpu"])
    total = GaugeMetricFamily("gkd_gpu_memory_total_bytes", "A GPU's memory", labels=["node", "gpu"])
    counted = GaugeMetricFamily("gkd_gpus", "GPUs by what their utilisation says: busy, idle (0), or unread",
                                labels=["utilization"])
    mean = GaugeMetricFamily("gkd_gpu_utilization_ratio_mean", "The mean utilisation of every GPU read")
    rows = list(st.gpus.values())  # (in the order first read: the same GPUs from one scrape to the next)
    kinds = {"busy": 0, "idle": 0, "unread": 0}
    read = [g.util for g in rows if g.util is not None]
    for g in rows:
        kinds["unread" if g.util is None else "idle" if g.util == 0 else "busy"] += 1
    for kind, n in kinds.items():
        counted.add_metric([kind], n)
    if read:
        mean.add_metric([], sum(read) / len(read) / 100)
    for g in rows[:GPUS_MAX]:
        labels = [g.node, str(g.index)]
        if g.util is not None:
            util.add_metric(labels, g.util / 100)
        if g.mem_used is not None:
            used.add_metric(labels, g.mem_used)
        if g.mem_total is not None:
            total.add_metric(labels, g.mem_total)
    return [util, used, total, counted, mean]


def _memory(st: RunState) -> list[Metric]:
    used = GaugeMetricFamily("gkd_memory_used_bytes", "A memory scope's use (a cgroup, or the node)",
                             labels=["node", "scope"])
    limit = GaugeMetricFamily("gkd_memory_limit_bytes", "A memory scope's limit", labels=["node", "scope"])
    scopes = list(st.mem_scopes.values())
    if len(scopes) > SCOPES_MAX:  # the nearest their limits
        scopes = sorted(scopes, key=lambda s: -(s.used / s.limit if s.limit else 0.0))[:SCOPES_MAX]
    for s in scopes:
        used.add_metric([s.node, s.scope], s.used)
        if s.limit:
            limit.add_metric([s.node, s.scope], s.limit)
    return [used, limit]


def _queues(st: RunState) -> list[Metric]:
    depth = GaugeMetricFamily("gkd_pipeline_queue_depth", "A job's queue's length", labels=["worker", "queue"])
    puts = CounterMetricFamily("gkd_pipeline_queue_puts", "Items put into a job's queue", labels=["worker", "queue"])
    for src in sorted(st.in_pipeline):
        w = st.workers.get(src)
        for q in w.flows[-1].queues if w is not None and w.flows else ():
            depth.add_metric([src, q.name], q.depth)
            puts.add_metric([src, q.name], q.puts)
    return [depth, puts]


def _alerts(st: RunState) -> list[Metric]:
    active = GaugeMetricFamily("gkd_alert_active", "An active alert, a series per target (always 1)",
                               labels=["code", "severity", "target"])
    for a in st.active_alerts():
        for target in a.targets[:ALERT_TARGETS_MAX] or [""]:
            active.add_metric([a.code, a.severity, target], 1)
    return [active]


@dataclass
class _Ask:
    answered: threading.Event = field(default_factory=threading.Event)
    families: list[Metric] = field(default_factory=list)


class Scrapes(Collector):
    """The hand-off between a scrape (the HTTP server's thread) and the supervisor's loop, which alone reads
    the state: ``collect`` asks and waits; the loop's ``answer`` (every tick) makes the families."""

    def __init__(self) -> None:
        self._asked: list[_Ask] = []
        self._lock = threading.Lock()

    def collect(self) -> Iterator[Metric]:
        ask = _Ask()
        with self._lock:
            self._asked.append(ask)
        if ask.answered.wait(ASK_DEADLINE_S):
            yield from ask.families
        else:  # the loop is busy past the deadline: said as such, not as a scrape that hangs
            up = GaugeMetricFamily("gkd_supervisor_answered", "Whether the supervisor's loop made this scrape")
            up.add_metric([], 0)
            yield up

    def answer(self, st: RunState, now: float, counts: SupervisorCounts) -> None:
        """On the loop: the families for every scrape waiting (made once for all of them)."""
        with self._lock:
            asked, self._asked = self._asked, []
        if not asked:
            return
        made = families(st, now, counts)
        for ask in asked:
            ask.families = made
            ask.answered.set()
