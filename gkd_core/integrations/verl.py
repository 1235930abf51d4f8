"""verl's plugin: what verl itself names, reported by each of its processes (DESIGN §10).

verl imports every ``verl.plugins`` entry point in each of its processes (driver, TaskRunner, every
worker) from ``verl/__init__.py``; ours is this module. Imported where no run asked for it (no
``GKD_REPORT=1`` in the environment) and none is wanted (no ``GKD_WATCH=1``: then it starts the run,
opt_in), it does nothing at all. Asked, it adds to what the Ray hooks
already see (each actor's methods, the controller's waits by rank, weight syncs as syncs):

- verl's timers (``marked_timer``, ``simple_timer``: every one goes through
  ``verl.utils.profiler.performance._timer``) as the process's phases, at the training step: the
  ``step`` timer counts the steps, and ``gen``, ``old_log_prob``, ``update_actor``, ... inside it are
  that step's phases, so the straggler rule compares step N's ``gen`` with its peers' step N;
- the metrics verl logs per step (``Tracking.log``) as ``metrics`` events: its losses, throughput
  and the ``timing_s/*`` of the step;
- its teacher loop's requests (``AsyncTeacherLLMServerManager.compute_teacher_logprobs_single``, in each
  agent-loop worker that distills from a teacher) as the teacher pane's client counts: sent, done, failed,
  in flight and their latency, a ``teacher`` event when they changed, at most once a second. The module
  is patched when verl imports it (post_import), never imported by us;
- its checkpoint engine's weight sync as a sync in parts (verl_weight_sync), patched the same way.

verl logs a plugin's import error only at DEBUG, so a failure here is said on stderr, once.
"""

from __future__ import annotations

import collections
import functools
import math
import statistics
import sys
import threading
import time
from collections.abc import Callable

from gkd_core.integrations import job_env, opt_in, verl_weight_sync
from gkd_core.integrations.post_import import when_imported
from gkd_core.telemetry import events as ev

STEP_TIMER = "step"
LOSS_KEYS = ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/distill_loss")
KL_KEYS = ("actor/kl", "actor/kl_loss", "actor/ppo_kl")
THROUGHPUT_KEYS = ("perf/throughput",)
TEACHER_MANAGER = "verl.experimental.teacher_loop.teacher_manager"
TEACHER_SAY_EVERY_S = 1.0
LATENCIES_KEPT = 512


def _number(data: dict, keys: tuple[str, ...]) -> float | None:
    for k in keys:
        v = data.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            return float(v)
    return None


def metrics_event(data: dict, step: int) -> ev.MetricsEvent:
    """One step's metrics as verl logs them (``actor/pg_loss``, ``timing_s/gen``, ...), as our event."""
    timing = {k.removeprefix("timing_s/"): float(v) for k, v in data.items()
              if k.startswith("timing_s/") and isinstance(v, (int, float)) and math.isfinite(v)}
    return ev.MetricsEvent(step=int(step), loss=_number(data, LOSS_KEYS), kl=_number(data, KL_KEYS),
                           tokens_per_s=_number(data, THROUGHPUT_KEYS), timing=timing,
                           grad_norm=_number(data, ("actor/grad_norm",)))


def _process():
    from gkd_core.integrations import ray_hook

    return ray_hook.installed()


def _patch_timer() -> None:
    from verl.utils.profiler import performance

    from gkd_core.integrations import ray_hook

    original = performance._timer

    @functools.wraps(original)
    def _timer(name, timing_raw):
        p = _process()
        if p is None:
            yield from original(name, timing_raw)
            return
        if name == STEP_TIMER:
            p.step = (p.step or 0) + 1
        token = ray_hook.begin(name, step=p.step)
        try:
            yield from original(name, timing_raw)
        finally:
            ray_hook.end(token)

    performance._timer = _timer


def _patch_tracking() -> None:
    from verl.utils.tracking import Tracking

    original = Tracking.log

    @functools.wraps(original)
    def log(self, data, step, backend=None):
        out = original(self, data, step, backend=backend)
        p = _process()
        if p is not None and isinstance(data, dict) and isinstance(step, int):
            try:
                p.emit(metrics_event(data, step))
                if p.step is None or step > p.step:
                    p.step = step  # verl's own count wins: a resumed run starts past 1
            except Exception as e:
                _say(e)
        return out

    Tracking.log = log


class TeacherCounts:
    """One process's teacher requests, said as the client side of the teacher pane (``teacher`` events):
    by a thread of its own, once a second while they change, so that requests that stop returning are seen
    as owed (in flight, with no answer since) even when nothing else happens in the process."""

    def __init__(self, emit: Callable[[ev.Event], bool]):
        self.emit = emit  # whether it went out
        self.sent = self.completed = self.failed = 0
        self.latencies: collections.deque[float] = collections.deque(maxlen=LATENCIES_KEPT)
        self._said: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def started(self) -> float:
        with self._lock:
            self.sent += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._say_each_second, name="gkd-teacher-counts", daemon=True)
                self._thread.start()
        return time.monotonic()

    def ended(self, t0: float, ok: bool) -> None:
        with self._lock:
            if ok:
                self.completed += 1
                self.latencies.append(1000 * (time.monotonic() - t0))
            else:
                self.failed += 1

    def event(self) -> ev.TeacherEvent:
        with self._lock:
            lat = sorted(self.latencies)
            quantiles = ({"p50": statistics.median(lat), "p95": lat[int(0.95 * (len(lat) - 1))],
                          "p99": lat[int(0.99 * (len(lat) - 1))]} if lat else {})
            return ev.TeacherEvent(side="client", sent=self.sent, completed=self.completed, failed=self.failed,
                                   in_flight=self.sent - self.completed - self.failed, latency_ms=quantiles)

    def _say_each_second(self) -> None:
        while True:  # a daemon thread, for the life of the process
            time.sleep(TEACHER_SAY_EVERY_S)
            counts = (self.sent, self.completed, self.failed)
            if counts != self._said:
                try:
                    if self.emit(self.event()):
                        self._said = counts  # (else said again at the next second)
                except Exception as e:
                    _say(e)
                    return


def _emit(event: ev.Event) -> bool:
    """Whether it went out: not before the process knows who it is (it has no reporter until then)."""
    p = _process()
    if p is None or p.activity.reporter is None:
        return False
    p.emit(event)
    return True


def _patch_teacher_manager(module) -> None:
    manager = module.AsyncTeacherLLMServerManager
    original = manager.compute_teacher_logprobs_single
    counts = TeacherCounts(_emit)

    @functools.wraps(original)
    async def compute_teacher_logprobs_single(self, *args, **kwargs):
        t0, ok = counts.started(), False
        try:
            out = await original(self, *args, **kwargs)
            ok = True
            return out
        finally:
            counts.ended(t0, ok)

    manager.compute_teacher_logprobs_single = compute_teacher_logprobs_single


_said = False  # the plugin's trouble, said once


def _say(err: BaseException) -> None:
    global _said
    if not _said:
        _said = True
        print(f"gkd: the verl plugin cannot report verl's phases and metrics ({type(err).__name__}: {err}); the "
              "job runs on unchanged (set VERL_USE_EXTERNAL_PLUGINS=none to not load it)", file=sys.stderr,
              flush=True)


def install() -> None:
    if not (opt_in.wanted() or job_env.asked()):
        return  # not asked: nothing more is imported, started or said
    from gkd_core.integrations import ray_hook

    if opt_in.wanted() and not ray_hook.in_ray_worker():  # verl's driver imports verl before ray.init
        try:
            opt_in.start_run()
        except Exception as e:
            _say(e)
            return
    if not job_env.asked():
        return
    try:
        ray_hook.ensure_installed()
        _patch_timer()
        _patch_tracking()
        when_imported(TEACHER_MANAGER, _patch_teacher_manager)
        when_imported(verl_weight_sync.CHECKPOINT_ENGINE, verl_weight_sync.patch)
    except Exception as e:
        _say(e)


install()
