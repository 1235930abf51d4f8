"""What Ray itself says of a run's actors, through the state API: a second view of each worker.

A worker's own Reporter says which phase it is in; Ray says whether its actor is alive, and which
method it is running since when. The two disagree exactly when something is wrong (a worker
that reports ``idle`` while Ray has a ``sync_rollout_weights`` task running on it for 400 s, an
actor Ray has marked DEAD while its last heartbeat is only seconds old), so the driver runs a
:class:`RayWatcher` thread and sends what Ray says as ``ray`` events.

:func:`poll` is also what ``gkd-tui attach --ray-address`` reads (gkd_tui/sources/ray_state.py).
"""

from __future__ import annotations

import threading
from typing import Callable

from gkd_core.telemetry import events as ev

POLL_S = 2.0
TIMEOUT_S = 3.0
LIMIT = 10_000  # the state API's own ceiling


def poll(address: str | None = None, timeout_s: float = TIMEOUT_S, finished: bool = False):
    """(nodes, actors, running tasks) from the state API, each call under ``timeout_s``; with
    ``finished``, the finished tasks too (their start and end: the peers' times of a straggler).
    Raises what the state API raises (unreachable, refused)."""
    from ray.util import state as ray_state

    kw = {"address": address, "timeout": timeout_s, "limit": LIMIT, "raise_on_missing_output": False}
    nodes = ray_state.list_nodes(**kw)
    actors = ray_state.list_actors(detail=True, **kw)
    # detail gives the start times; the filter keeps it to the tasks running now
    tasks = ray_state.list_tasks(filters=[("state", "=", "RUNNING")], detail=True, **kw)
    if finished:
        tasks = tasks + ray_state.list_tasks(filters=[("state", "=", "FINISHED")], detail=True, **kw)
    return nodes, actors, tasks


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


class RayWatcher:
    """Polls the run's actors (``names``: actor id -> worker src) and emits a ``ray`` event for each
    change. One poll at a time, each under a deadline; a failed poll is said once, not per poll."""

    def __init__(self, emit: Callable[[ev.Event], None], names: Callable[[], dict[str, str]],
                 interval_s: float = POLL_S, timeout_s: float = TIMEOUT_S):
        self.emit, self.names = emit, names
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.polls = 0
        self._shown: dict[str, tuple] = {}
        self._error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gkd-ray-watch", daemon=True)

    def start(self) -> "RayWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll_once()

    def poll_once(self) -> None:
        names = self.names()
        try:
            _, actors, tasks = poll(None, self.timeout_s)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[:200]
            if error != self._error:
                self._error = error
                self.emit(ev.LogEvent(level="warn", message=f"the Ray state API did not answer: {error}"))
            return
        self._error = ""
        self.polls += 1
        running = {t.actor_id: t for t in tasks if t.actor_id}
        for a in actors:
            src = names.get(a.actor_id)
            if src is None:
                continue  # not one of this run's workers (an agent, another job's actor)
            view = actor_view(a, running.get(a.actor_id))
            if self._shown.get(src) != view:
                self._shown[src] = view
                state, task, started, cause = view
                self.emit(ev.RayEvent(target=src, actor_id=a.actor_id, state=state, task=task, task_started=started,
                                      death_cause=cause))
