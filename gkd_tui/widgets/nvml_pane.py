"""The GPUs, and a loud banner when NVML has stopped answering (the seeds' frozen nvidia-smi).

A run of a few nodes shows each GPU. A larger one (131,072 GPUs at the largest, and the app redraws ten times
a second) shows what holds for all of them, from sums the reducer keeps as readings come (how many, their mean
utilisation and memory, how many at 0 %), and then the GPUs worth a look: those the diagnosis names. Each GPU's
history is in the plots' GPU tab (``p``).
"""

from __future__ import annotations

import collections

from rich.text import Text

from gkd_core.state import RunState
from gkd_core.state.records import GpuRow
from gkd_tui.widgets.format import fmt_bytes, fmt_duration
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import SEVERITY, WARNING

ROWS_ALL = 32  # a run with at most this many GPUs shows each; a larger one its sums and the GPUs named
NOTES_ALL = 8  # nodes' notes shown one by one; more are counted by what they say
GPU_CODES = ("gpu_idle_full", "gpu_unbalanced")  # the alerts whose targets are GPUs (``gpu NODE/INDEX``)


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
        if len(st.gpu_notes) <= NOTES_ALL:
            for node, note in sorted(st.gpu_notes.items()):
                t.append(f"{node}: {note}\n", style="dim")
        else:
            for note, n in collections.Counter(st.gpu_notes.values()).most_common(NOTES_ALL):
                t.append(f"{n:,} nodes: {note}\n", style="dim")
        if not st.gpus and not hung and not st.gpu_notes:
            t.append("GPU: no NVML readings in this run (CPU run, or no node agent)", style="dim")
        if len(st.gpus) <= ROWS_ALL:
            rows = st.gpu_rows()
        else:
            rows = self._sums(t, st, now)
        for g in rows:
            self._row(t, g)
        self.put(t)

    def _sums(self, t: Text, st: RunState, now: float) -> list[GpuRow]:
        """What holds for every GPU, said in a line; the GPUs the diagnosis names, at most ROWS_ALL."""
        sums, mean = st.series.gpu_sums, st.series.gpu_sums.mean(now)
        util = f"{mean.util:.0f} %" if mean.util is not None else "-"
        mem = f"{100 * mean.mem:.0f} %" if mean.mem is not None else "-"
        # each GPU once, whichever alerts name it (a GPU full and idle is far below the busiest too)
        named = list(dict.fromkeys(key.removeprefix("gpu ") for a in st.alerts.values() if a.code in GPU_CODES
                                   for key in a.targets if key.startswith("gpu ")))
        rows = [g for key in named if (g := st.gpus.get(key)) is not None][:ROWS_ALL]
        t.append(f"{len(st.gpus):,} GPUs: utilisation {util} on average, memory {mem}; {sums.idle_n:,} at 0 %",
                 style=self.tone(WARNING if sums.idle_n else None))
        t.append((f"; {len(named):,} named, " + ("below" if len(named) <= ROWS_ALL else f"the first {ROWS_ALL} below")
                  if named else "; none named by the diagnosis"), style="dim")
        t.append(" (each one's history: the plots' GPU tab, p)\n", style="dim")
        return rows

    def _row(self, t: Text, g: GpuRow) -> None:
        mem = f"{fmt_bytes(g.mem_used)}/{fmt_bytes(g.mem_total)}"
        util = f"{g.util:.0f}%" if g.util is not None else "-"
        idle_full = g.util == 0 and g.mem_used and g.mem_total and g.mem_used > 0.5 * g.mem_total
        style = self.tone(WARNING if idle_full else None)
        t.append(f"GPU{g.index} {g.node[:10]:10s} util {util:>4s} mem {mem:>11s} "
                 f"{g.temp or 0:.0f}C {g.power or 0:.0f}W", style=style)
        if g.pids:
            t.append(f" pids {','.join(map(str, g.pids[:4]))}", style="dim")
        t.append("\n")
