"""`gkd-tui attach` without a dashboard: one line per thing that matters, until the run ends."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import events as ev
from gkd_core.vocab import RUN_ENDED
from gkd_tui.render_text import status_text


def describe(e: ev.Event | ev.UnknownEvent) -> str | None:
    """One line for an event worth a line (phases, syncs, alerts, runs, actions), else None."""
    t = time.strftime("%H:%M:%S", time.localtime(e.ts))
    if isinstance(e, ev.RunEvent):
        return f"{t} run {e.state} {e.reason}".rstrip()
    if isinstance(e, ev.PhaseEvent):
        # the driver's phases tell the story; each worker's would flood the terminal
        if e.src != "driver" or e.phase in ("idle", "generate", "teacher_wait", "train", "sync_weights"):
            return None
        return f"{t} {e.src:12s} {e.phase}" + (f" step {e.step}" if e.step is not None else "") + (
            f" ({e.detail})" if e.detail else "")
    if isinstance(e, ev.SyncEvent) and e.state not in ("progress", "started", "done"):
        pend = f" pending {', '.join(e.pending)}" if e.pending else ""
        return f"{t} sync {e.sync_id} {e.state} {e.elapsed_s:.2f}s/{e.timeout_s:g}s{pend}"
    if isinstance(e, ev.LogEvent) and e.level in ("warn", "error"):
        return f"{t} {e.src:12s} {e.level}: {e.message}"
    if isinstance(e, ev.AlertEvent):
        return f"{t} {'cleared' if e.cleared else e.severity.upper()} {e.code}: {e.message}"
    if isinstance(e, ev.ActionEvent):
        return f"{t} action {e.op} by {e.by}: {'ok' if e.ok else 'refused'} {e.result_said}"
    if isinstance(e, ev.MetricsEvent):
        vals = [f"{k}={getattr(e, k):.4g}" for k in ("loss", "kl", "agreement") if getattr(e, k) is not None]
        step_s = sum(e.timing.values())
        return f"{t} step {e.step} " + " ".join(vals) + (f" ({step_s:.2f} s)" if step_s else "")
    return None


def follow(run: Path) -> int:
    sub = RunSubscriber(run)
    try:
        sub.connect()
        print(status_text(sub.state, time.time(), run), flush=True)
        while sub.state.state not in RUN_ENDED:
            for e in sub.pump(0.5):
                line = describe(e)
                if line:
                    print(line, flush=True)
        return 0
    except KeyboardInterrupt:
        print("\ndetached; the run goes on (`gkd-tui stop` ends it)", file=sys.stderr)
        return 0
    finally:
        sub.close()
