"""What Ray itself says of actors, through the state API, as events: one module for both readers.

:class:`RayView` turns a poll (nodes, actors, tasks) into events. For a gkd run (the driver's
:class:`RayWatcher`) the actors are the run's workers, whose own Reporters say their phases; Ray's
is a second view of each (alive or dead, which method since when, why it died), sent as ``ray``
events, and the two disagree exactly when something is wrong (a worker that reports ``idle``
while Ray has ``sync_rollout_weights`` running on it for 400 s). For any other Ray job (``gkd-tui
attach --ray-address``, gkd_core/node/ray_cluster.py) every actor is a worker, named by its class,
and its calls are its phases, the finished ones with their real start and end (its peers' times).
Nodes and their resources go out in both: whether a pending actor's demand fits anywhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from gkd_core.state import SPANS_KEEP
from gkd_core.telemetry import events as ev
from gkd_core.vocab import src_of

POLL_S = 2.0
TIMEOUT_S = 3.0
LIMIT = 10_000  # the state API's own ceiling
HISTORY_S = 120.0  # finished calls this recent are taken in at the first poll: the peers' times
TERMINAL = {"DEAD": "exited"}


def poll(address: str | None = None, timeout_s: float = TIMEOUT_S, finished: bool = False):
    """(nodes, actors, running tasks) from the state API, each call under ``timeout_s``; with
    ``finished``, the finished tasks too (their start and end: the peers' times of a straggler).
    Raises what the state API raises (unreachable, refused)."""
    from ray.util import state as ray_state

    kw: dict[str, Any] = {"address": address, "timeout": timeout_s, "limit": LIMIT, "raise_on_missing_output": False}
    nodes = ray_state.list_nodes(**kw)
    actors = ray_state.list_actors(detail=True, **kw)
    # detail gives the start times; the filter keeps it to the tasks running now
    tasks = ray_state.list_tasks(filters=[("state", "=", "RUNNING")], detail=True, **kw)
    if finished:
        tasks = tasks + ray_state.list_tasks(filters=[("state", "=", "FINISHED")], detail=True, **kw)
    return nodes, actors, tasks


def poll_placement_groups(address: str | None = None, timeout_s: float = TIMEOUT_S) -> list:
    """The placement groups from the state API (their bundles and Ray's scheduling state)."""
    from ray.util import state as ray_state

    # (Ray annotates the timeout as int; it takes seconds, fractions too)
    return ray_state.list_placement_groups(address=address, timeout=timeout_s, limit=LIMIT,  # type: ignore[arg-type]
                                           detail=True, raise_on_missing_output=False)


def placement_group_event(pg_id: str, name: str, state: str, strategy: str, bundles: list[dict],
                          stats: dict | None = None, ts: float = 0.0) -> ev.RayPlacementGroupEvent:
    """One placement group as an event, from either of Ray's views of it (the state API's, the GCS's)."""
    stats = stats or {}
    try:  # the state API's stats say when Ray took the request (ns, as a string)
        created = int(stats["creation_request_received_ns"]) / 1e9 or None
    except (KeyError, TypeError, ValueError):
        created = None
    return ev.RayPlacementGroupEvent(
        pg_id=pg_id, name=name, state=state, strategy=strategy,
        scheduling=str(stats.get("scheduling_state", "")) if state == "PENDING" else "", created=created,
        bundles=[{k: float(v) for k, v in b.items()} for b in bundles], ts=ts)


def actor_view(actor, task) -> tuple[str, str, float | None, str]:
    """(state, running method or "", since when, why it died) of one actor."""
    method = (task.name.rpartition(".")[2] or task.name) if task is not None else ""
    started = task.start_time_ms / 1000 if task is not None and task.start_time_ms else None
    cause = ""
    if actor.state == "DEAD":
        info = getattr(actor, "death_cause", None) or {}
        cause = str(info.get("actor_died_error_context", {}).get("error_message", "") if isinstance(info, dict)
                    else info)[:300]
    return actor.state, method, started, cause


class RayView:
    """A poll of the state API as events. ``names`` (actor id -> worker, called at each poll): the
    actors of a gkd run, of which only Ray's view is sent; None: every actor is a worker."""

    def __init__(self, names: Callable[[], dict[str, str]] | None = None):
        self.known = names
        self.names: dict[str, str] = {}  # actor id -> the worker name shown (attach)
        self.node_ip: dict[str, str] = {}  # node id -> ip
        self._nodes: dict[str, tuple] = {}  # node id -> (state, resources) last sent
        self._shown: dict[str, tuple] = {}  # worker -> what was last sent of it
        self._done: dict[str, float] = {}  # finished task id -> its end, taken in already
        self._pgs: dict[str, tuple] = {}  # placement group id -> what was last sent of it
        self._since = time.time() - HISTORY_S

    def events(self, nodes, actors, tasks) -> list[ev.Event]:
        now = time.time()
        out: list[ev.Event] = []
        self.node_ip.update({n.node_id: n.node_ip for n in nodes})
        for n in nodes:
            view = (n.state, tuple(sorted((n.resources_total or {}).items())))
            if self._nodes.get(n.node_id) != view:
                self._nodes[n.node_id] = view
                out.append(ev.RayNodeEvent(node=n.node_ip, node_id=n.node_id, state=n.state,
                                           resources=dict(n.resources_total or {}), ts=now))
        running = {t.actor_id: t for t in tasks if t.actor_id and getattr(t, "state", "RUNNING") == "RUNNING"}
        if self.known is not None:
            out += self._run_workers(self.known(), actors, running, now)
        else:
            out += self._every_actor(actors, running, tasks, now)
        return out

    def placement_groups(self, pgs) -> list[ev.Event]:
        """The state API's placement groups as events: each change, and the removal of those gone."""
        now, seen = time.time(), set()
        out: list[ev.Event] = []
        for pg in pgs:
            seen.add(pg.placement_group_id)
            bundles = [dict(b.get("unit_resources") or {}) for b in (pg.bundles or [])]
            strategy = getattr(pg, "strategy", "") or ""  # (the state API of Ray 2.60 does not say)
            e = placement_group_event(pg.placement_group_id, pg.name or "", pg.state, strategy, bundles,
                                      pg.stats, now)
            view = (e.state, e.strategy, e.scheduling, repr(e.bundles))
            if self._pgs.get(pg.placement_group_id) != view:
                self._pgs[pg.placement_group_id] = view
                out.append(e)
        for gone in [p for p in self._pgs if p not in seen]:
            del self._pgs[gone]
            out.append(ev.RayPlacementGroupEvent(pg_id=gone, state="REMOVED", ts=now))
        return out

    def _run_workers(self, names: dict[str, str], actors, running: dict, now: float) -> list[ev.Event]:
        out: list[ev.Event] = []
        for a in actors:
            src = names.get(a.actor_id)
            if src is None:
                continue  # not one of this run's workers (an agent, another job's actor)
            view = actor_view(a, running.get(a.actor_id))
            if self._shown.get(src) != view:
                self._shown[src] = view
                state, task, started, cause = view
                out.append(ev.RayEvent(target=src, actor_id=a.actor_id, state=state, task=task, task_started=started,
                                       death_cause=cause, ts=now, required=_required(a)))
        return out

    def _every_actor(self, actors, running: dict, tasks, now: float) -> list[ev.Event]:
        out: list[ev.Event] = []
        finished: dict[str, list] = {}
        for t in tasks:
            if (t.actor_id and getattr(t, "state", "") == "FINISHED" and t.task_id not in self._done
                    and t.start_time_ms and t.end_time_ms and t.end_time_ms / 1000 > self._since):
                finished.setdefault(t.actor_id, []).append(t)
        counts: dict[str, int] = {}
        for a in sorted(actors, key=lambda a: (a.class_name, a.actor_id)):
            name = self.names.get(a.actor_id)
            if name is None:
                rank = counts.get(a.class_name, 0)
                name = a.name or src_of(a.class_name, rank)
                self.names[a.actor_id] = name
            counts[a.class_name] = counts.get(a.class_name, 0) + 1
            node = self.node_ip.get(a.node_id or "", (a.node_id or "")[:8])
            if name not in self._shown:
                out.append(ev.WorkerEvent(src=name, role=a.class_name, node=node, pid=a.pid or 0,
                                          actor_id=a.actor_id, ts=now))
            out.extend(self._finished_calls(name, finished.get(a.actor_id, [])))
            state, method, started, cause = actor_view(a, running.get(a.actor_id))
            task_id = running[a.actor_id].task_id if method else ""
            if a.state in TERMINAL:
                shown = (TERMINAL[a.state], "")
            elif method:
                shown = (method, task_id)
            else:
                shown = ("idle" if a.state == "ALIVE" else a.state.lower(), "")
            if self._shown.get(name) == shown:
                continue
            prev = self._shown.get(name)
            if prev and prev[0] == shown[0] and prev[1] != shown[1]:
                out.append(ev.PhaseEvent(src=name, phase="idle", ts=now))  # the same method again: a new start
            out.append(ev.PhaseEvent(src=name, phase=shown[0], started=started, ts=now,
                                     detail=f"task {task_id[:16]}" if task_id else f"actor {a.state}"))
            out.append(ev.RayEvent(target=name, actor_id=a.actor_id, state=state, task=method, task_started=started,
                                   death_cause=cause, ts=now, required=_required(a)))
            self._shown[name] = shown
        # a finished call is taken in once: the window moves on, and what fell out of it is forgotten
        self._since = max(self._since, now - HISTORY_S)
        self._done = {k: end for k, end in self._done.items() if end > self._since}
        return out

    def _finished_calls(self, name: str, tasks: list) -> list[ev.Event]:
        """The calls of one actor that ended since the last poll, as phases with their real start and
        end (a call that began and ended between two polls is a span too): its peers' times."""
        out: list[ev.Event] = []
        ordered = sorted(tasks, key=lambda t: t.start_time_ms)
        for t in ordered[:-SPANS_KEEP]:  # older than the reducer keeps: taken in, not shown
            self._done[t.task_id] = t.end_time_ms / 1000
        for t in ordered[-SPANS_KEEP:]:
            start, end = t.start_time_ms / 1000, t.end_time_ms / 1000
            self._done[t.task_id] = end
            if self._shown.get(name, ("", ""))[1] != t.task_id:  # not seen running: its start first
                out.append(ev.PhaseEvent(src=name, phase=t.name.rpartition(".")[2] or t.name, started=start,
                                         ts=start, detail=f"task {t.task_id[:16]}"))
            out.append(ev.PhaseEvent(src=name, phase="idle", started=end, ts=end))
            self._shown[name] = ("idle", "")
        return out


def _required(actor) -> dict[str, float]:
    """What a pending actor asks for (its resource request), while Ray cannot place it."""
    return dict(getattr(actor, "required_resources", None) or {}) if actor.state == "PENDING_CREATION" else {}


class RayWatcher:
    """Polls the run's actors (``names``: actor id -> worker src) and emits a ``ray`` event for each
    change. One poll at a time, each under a deadline; a failed poll is said once, not per poll."""

    def __init__(self, emit: Callable[[ev.Event], None], names: Callable[[], dict[str, str]],
                 interval_s: float = POLL_S, timeout_s: float = TIMEOUT_S):
        self.emit, self.names = emit, names
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.polls = 0
        self.view = RayView(names)
        self._error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gkd-ray-watch", daemon=True)

    def start(self) -> RayWatcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll_once()

    def poll_once(self) -> None:
        try:
            nodes, actors, tasks = poll(None, self.timeout_s)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[:200]
            if error != self._error:
                self._error = error
                self.emit(ev.LogEvent(level="warn", message=f"the Ray state API did not answer: {error}"))
            return
        self._error = ""
        self.polls += 1
        for event in self.view.events(nodes, actors, tasks):
            self.emit(event)
