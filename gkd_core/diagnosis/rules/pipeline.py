"""A pipeline's producer that has died: a call that waits on data (a queue's get, a gate) which only a thread
of its own process fed, and that thread has ended. Nothing will ever put into the queue again; the call polls
or waits on forever, busy or idle but not progressing (slime's collector, polling its buffer with a timeout,
after the rollout thread raised). Named at once, with the thread and its error as the worker's wait says
them (data_waits reads them from ``threading.excepthook``)."""

from __future__ import annotations

from gkd_core.diagnosis.rules.common import Settings
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken
from gkd_core.vocab import DataWait


def producer_died(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    out = []
    for src in sorted(state.waiting):
        w = state.workers.get(src)
        if w is None:
            continue
        waits = [d for d in map(DataWait.parse, w.waits_on) if d is not None]
        dead = [d for d in waits if d.methods and all(DataWait.ended(m) for m in d.methods)]
        if not dead:
            continue
        threads = sorted({DataWait.thread(m) for d in dead for m in d.methods})
        error = w.detail.partition("which ended with ")[2] or "(its error not seen)"
        since = max(w.phase_since, w.waits_since)
        out.append(AlertEvent(
            severity="critical", code="producer_died", targets=[src],
            message=f"{src}.{w.phase} waits on data that only its thread {', '.join(threads)} fed, which has ended "
                    f"with {error}; waiting {spoken(now - since)}",
            hint="the producer thread died and nothing restarts it, so the queue stays empty: its error above is "
                 "the cause (the job's log has its traceback); fix it, or make the producer say its death to the "
                 "consumer (put a sentinel, set an error the collector raises) instead of leaving it polling",
            evidence={"threads": threads, "error": error[:300], "elapsed_s": round(now - since, 1)}))
    return out
