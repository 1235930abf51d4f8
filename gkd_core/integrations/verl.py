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
  and the ``timing_s/*`` of the step.

verl logs a plugin's import error only at DEBUG, so a failure here is said on stderr, once.
"""

from __future__ import annotations

import functools
import math
import sys

from gkd_core.integrations import job_env, opt_in
from gkd_core.telemetry import events as ev

STEP_TIMER = "step"
LOSS_KEYS = ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/distill_loss")
KL_KEYS = ("actor/kl", "actor/kl_loss", "actor/ppo_kl")
THROUGHPUT_KEYS = ("perf/throughput",)


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


def _say(err: BaseException) -> None:
    if not getattr(_say, "said", False):
        _say.said = True
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
    except Exception as e:
        _say(e)


install()
