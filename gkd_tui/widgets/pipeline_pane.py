"""The pipeline: for a job of queues and servers (an async RL job), what goes in and out of each queue, the
requests in flight at each server and at each address outside the job, and how idle the workers between
them are: which stage holds the others up, at a glance (the diagnosis says why, in the header)."""

from __future__ import annotations

from rich.text import Text

from gkd_core.state import RunState
from gkd_core.state.pipeline import PipelineView, pipeline_view
from gkd_tui.widgets.format import fmt_duration, sparkline
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import CAUTION, SERIES, TROUBLE

LATE_S = 5.0  # a request in flight this old is shown with caution, and past STUCK_S as trouble
STUCK_S = 30.0
ROWS_MAX = 3  # queues, servers and addresses each: the first ones, then how many more
IDLE_SHOWN_MAX = 4


class PipelinePane(Pane):
    """Shown for a run with a queue, a server or an address outside it (``PipelineView``), else hidden. Its
    numbers move by the second: the view is made again at most every ``EVERY_S`` (a job of thousands of actors
    waiting in ray.get has thousands of rows to look at)."""

    EVERY_S = 0.5
    _made: tuple[float, PipelineView] | None = None

    def show(self, st: RunState, now: float) -> PipelineView:
        if self._made is not None and 0 <= now - self._made[0] < self.EVERY_S:
            return self._made[1]
        view = pipeline_view(st, now)
        self._made = (now, view)
        self.display = bool(view)
        if view:
            self.put(self.render_view(view))
        return view

    def render_view(self, view: PipelineView) -> Text:
        t = Text()
        for q in view.queues[:ROWS_MAX]:
            t.append(f"{q.worker} {q.name.rpartition('.')[2]} ", style="bold")
            t.append(f"{q.depth} queued ", style=self.tone(CAUTION if not q.depth and q.takes_per_s == 0 else None))
            t.append(sparkline([float(d) for d in q.depths], 10), style=self.tone(SERIES["rate"]))
            t.append(f"\n  in {_rate(q.puts_per_s)}  out {_rate(q.takes_per_s)}\n")
            if sum(q.behind):
                t.append(f"  taken, versions behind: {staleness(q.behind)}\n")
        t.append(_more(len(view.queues), "queue"))
        for s in view.servers[:ROWS_MAX]:
            t.append(f"{s.worker} ", style="bold")
            t.append(f"{s.route}" + (f" {_rate(s.per_s)}" if s.per_s is not None else "") + "\n  ")
            self._in_flight(t, s.in_flight, s.oldest_s, "in flight")
        t.append(_more(len(view.servers), "server"))
        for p in view.peers[:ROWS_MAX]:
            t.append(f"{p.address} ", style="bold")
            t.append(f"outside the job, pid {p.pid}\n  " if p.pid else "not on this node\n  ")
            self._in_flight(t, len(p.waiters), p.oldest_s, f"waiting ({', '.join(p.waiters[:2])})")
        t.append(_more(len(view.peers), "address"))
        if view.idle:
            t.append("idle ")
            t.append("  ".join(f"{src} {share:.0%}" for src, share in view.idle[:IDLE_SHOWN_MAX]))
        return t

    def _in_flight(self, t: Text, n: int, oldest_s: float, what: str) -> None:
        if not n:
            t.append("none in flight\n", style="dim")
            return
        tone = TROUBLE if oldest_s >= STUCK_S else CAUTION if oldest_s >= LATE_S else None
        t.append(f"{n} {what}, oldest {fmt_duration(oldest_s)}\n", style=self.tone(tone))


def staleness(behind: list[int]) -> str:
    """A small histogram in words: ``0 ×12  1 ×5  5+ ×1`` (the buckets with samples in them)."""
    last = len(behind) - 1
    return "  ".join(f"{i}{'+' if i == last else ''} ×{n}" for i, n in enumerate(behind) if n)


def _rate(per_s: float | None) -> str:
    if per_s is None:
        return "?/s"
    return f"{per_s:.1f}/s" if per_s < 100 else f"{per_s:.0f}/s"


def _more(n: int, what: str) -> str:
    return f"  … {n - ROWS_MAX} more {what}{'es' if what.endswith('s') else 's'}\n" if n > ROWS_MAX else ""
