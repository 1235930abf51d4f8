"""The teacher: what the client sent against what the server received — which side is stuck."""

from __future__ import annotations

from rich.text import Text

from gkd_core.state import RunState
from gkd_tui.widgets.format import sparkline
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import CAUTION, FAILURE, SERIES, TROUBLE


class TeacherPane(Pane):
    def show(self, st: RunState, now: float) -> None:
        tot = st.teacher_totals()
        t = Text()
        if not st.teacher.by_src:
            t.append("no teacher traffic yet", style="dim")
            self.put(t)
            return
        t.append(f"client sent {tot.sent} done {tot.completed} ")
        t.append(f"failed {tot.failed} ", style=self.tone(FAILURE if tot.failed else None))
        t.append(f"timeout {tot.timed_out} ", style=self.tone(TROUBLE if tot.timed_out else None))
        t.append(f"in flight {tot.in_flight}\n")
        if any(key.startswith("server:") for key in st.teacher.by_src):
            t.append(f"server recv {tot.received} served {tot.served} ")
            t.append(f"queue {tot.queue_depth}", style=self.tone(CAUTION if tot.queue_depth else None))
        else:  # the server says its counts once a second: not yet is not nothing
            t.append("server: no counts reported yet", style="dim")
        # said when the diagnosis says it (requests owed past their limit, none received), not for the
        # moment between a send and the server's next report
        if any(a.code == "teacher_unreached" for a in st.alerts.values()):
            t.append("  the server received none of them!", style=self.tone(TROUBLE))
        lat = tot.latency_ms
        if lat:
            t.append(f"\nlatency p50 {lat.get('p50', 0):.1f} ms p95 {lat.get('p95', 0):.1f} ms")
        h = st.teacher.history
        rates = [(c1 - c0) / (t1 - t0) for (t0, c0), (t1, c1) in zip(h, h[1:], strict=False) if t1 > t0]
        if rates:
            t.append(f"\nreq/s {st.teacher_rate():.1f} ")
            t.append(sparkline(rates, 20), style=self.tone(SERIES["rate"]))
        self.put(t)
