"""The GPUs, and a loud banner when NVML has stopped answering (the seeds' frozen nvidia-smi)."""

from __future__ import annotations

from rich.text import Text

from gkd_core.state import RunState
from gkd_tui.widgets.format import fmt_bytes, fmt_duration
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import SEVERITY, WARNING


class NvmlPane(Pane):
    def show(self, st: RunState, now: float) -> None:
        t = Text()
        hung = st.hung_probes(now)
        for node, probe, seconds in hung:
            name = "NVML" if probe == "nvml" else probe
            t.append(f" {name} not answering on {node} for {fmt_duration(seconds)} ",
                     style=self.tone(SEVERITY["critical"]))
            t.append("\n")
        if hung:
            t.append("a hung driver freezes nvidia-smi too: check dmesg for Xid errors; the run's own "
                     "phases are still live\n", style="italic")
        for node, note in sorted(st.gpu_notes.items()):
            t.append(f"{node}: {note}\n", style="dim")
        rows = st.gpu_rows()
        if not rows and not hung and not st.gpu_notes:
            t.append("GPU: no NVML readings in this run (CPU run, or no node agent)", style="dim")
        for g in rows:
            mem = f"{fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}"
            util = f"{g.util:.0f}%" if g.util is not None else "-"
            idle_full = g.util == 0 and g.mem_used and g.mem_total and g.mem_used > 0.5 * g.mem_total
            style = self.tone(WARNING if idle_full else None)
            t.append(f"GPU{g.index} {g.node[:10]:10s} util {util:>4s} mem {mem:>11s} "
                     f"{g.temp or 0:.0f}C {g.power or 0:.0f}W", style=style)
            if g.pids:
                t.append(f" pids {','.join(map(str, g.pids[:4]))}", style="dim")
            t.append("\n")
        self.put(t)
