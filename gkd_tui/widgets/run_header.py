"""The top line: run, state, step, elapsed, restarts, the most severe alert with its hint, and what holds
the job when it is held (diagnosis.holds: a cycle, a collective or sync, a server's request, an external call)."""

from __future__ import annotations

from rich.text import Text

from gkd_core.diagnosis.holds import what_holds
from gkd_core.state import RunState
from gkd_tui.widgets.format import fmt_duration
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import NO_ALERTS, SEVERITY, STATE


class RunHeader(Pane):
    def show(self, st: RunState, now: float, source: str) -> None:
        t = Text()
        t.append("gkd ", style="bold")
        t.append(st.run or "(no run yet)")
        t.append("  ")
        t.append(st.state or "unknown", style=self.tone(STATE.get(st.state)))
        t.append(f"  step {st.step if st.step is not None else '-'}/{st.total_steps or '?'}")
        t.append(f"  {fmt_duration(now - st.started) if st.started else '-'}")
        t.append(f"  restarts {st.restarts}")
        if self.size.width >= 100:  # on 80 columns the run's own facts come first
            t.append(f"  [{source}]", style="dim")
        alerts = st.active_alerts()
        t.append("\n")
        if alerts:
            a = alerts[0]
            t.append(f" {a.severity.upper()} ", style=self.tone(SEVERITY.get(a.severity)))
            t.append(f" {a.message}")
            if len(alerts) > 1:
                t.append(f"  (+{len(alerts) - 1} more)", style="dim")
            if a.hint:
                t.append(f"\n → {a.hint}", style="italic")
            held = what_holds(st, now)
            if held:
                t.append(f"\n held by {held}", style="bold")
        else:
            t.append(" no alerts", style=self.tone(NO_ALERTS))
        self.put(t)
