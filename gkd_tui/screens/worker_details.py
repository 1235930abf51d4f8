"""`enter` on a worker: everything the run knows about it, its last stack and its log lines."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gkd_core.state import RunState
from gkd_core.state.records import PhaseSpan
from gkd_core.telemetry import events as ev
from gkd_tui.widgets.format import fmt_bytes, fmt_duration


class WorkerDetails(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,enter", "app.pop_screen", "Close")]

    def __init__(self, st: RunState, src: str, now: float):
        super().__init__()
        self.text = self.describe(st, src, now)

    @staticmethod
    def describe(st: RunState, src: str, now: float) -> str:
        w = st.workers.get(src)
        if w is None:
            return f"{src}: not in this run"
        age = st.heartbeat_age(w, now)
        lines = [
            f"{w.src}  role {w.role}  rank {w.rank}  node {w.node or '-'}  pid {w.pid or '-'}  "
            f"GPU {','.join(map(str, w.gpus)) or '-'}",
            f"phase {w.phase} for {fmt_duration(st.time_in_phase(w, now))}, step {w.step}"
            + (f", deadline in {fmt_duration(w.deadline - now)}" if w.deadline else ""),
            f"heartbeat {fmt_duration(age)} ago, rss {fmt_bytes(w.rss)}, cpu {w.cpu:.0f}%, dropped {w.dropped}",
        ]
        if w.mem is not None:
            m = w.mem
            scope = "the node" if m.scope == "node" else f"its cgroup {m.scope}"
            lines.append(f"memory: {scope} {fmt_bytes(m.used)} of {fmt_bytes(m.limit)}, "
                         f"{fmt_bytes(m.available)} available on the node"
                         + (f", {m.oom_kills} OOM kill(s) in it so far" if m.oom_kills else ""))
        on_gpus = [f"GPU {row.index} {fmt_bytes(row.proc_mem[str(w.pid)])}" for row in st.gpu_rows()
                   if row.node == w.node and str(w.pid) in row.proc_mem]
        if on_gpus:
            lines.append("GPU memory it holds (NVML): " + ", ".join(on_gpus))
        by_phase = phase_peaks(w.spans)
        if by_phase:
            lines.append(peaks_line(by_phase))
        if w.oom_killed is not None:
            k = w.oom_killed
            lines.append(f"killed by the OOM killer: its scope's kills {k.kills_before} -> {k.kills_after}")
        if w.blocked_by:
            lines.append(f"blocked by {w.blocked_by}: it waits on {w.blocked_by}, or failed only because of it; "
                         f"the alert names {w.blocked_by} as the cause")
        if w.detail:
            lines.append(f"detail: {w.detail}")
        if w.engine is not None:
            lines.append(engine_line(w.engine))
        if w.actor_id or w.ray_state:
            ray = f"ray actor {w.actor_id or '?'}: {w.ray_state or 'no word from the state API yet'}"
            if w.ray_task:
                since = f" for {fmt_duration(now - w.ray_task_since)}" if w.ray_task_since else ""
                ray += f", running {w.ray_task}{since}"
            if w.ray_death_cause:
                ray += f"\n  died: {w.ray_death_cause}"
            lines.append(ray)
        for group, members in sorted(st.collectives.items()):
            p = members.get(src)
            if p is not None:
                where = (f"entered {p.op or 'collective'} #{p.entered} {fmt_duration(now - p.entered_at)} ago"
                         if p.entered else "no collective yet")
                out = ("left it" if p.left is not None and p.left >= p.entered else
                       "not left" if p.left is not None else "its leaving unknown (gloo's Flight Recorder)")
                lines.append(f"group {group}: rank {p.rank} of {p.world}, {where}, {out} ({p.source})")
        logs = [line.said() for line in st.logs if line.src == src][-10:]
        lines.append("\nlog:")
        lines.extend(logs or ["(no log lines from it)"])
        rec = st.stacks.get(src)
        lines.append("\nlast stack" + (f" (dump {rec.dump_id}, {rec.method})" if rec else ""))
        lines.append((rec.text or rec.error) if rec else "(none yet: press d on it)")
        return "\n".join(lines)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="details"):
            yield Static(self.text, markup=False)


def phase_peaks(spans: list[PhaseSpan]) -> dict[str, int]:
    """Each phase's peak memory over its kept spans (those whose reporter said it), largest first."""
    peaks: dict[str, int] = {}
    for span in spans:
        if span.peak_rss:
            peaks[span.phase] = max(peaks.get(span.phase, 0), span.peak_rss)
    return dict(sorted(peaks.items(), key=lambda kv: -kv[1]))


def peaks_line(peaks: dict[str, int], shown: int = 4) -> str:
    """"memory by phase (peak): sync_weights 2.1 GB (2.1x train), train 1.0 GB" — against the phase of
    least memory, the worker's own baseline."""
    low_phase, low = min(peaks.items(), key=lambda kv: kv[1])
    parts = [f"{phase} {fmt_bytes(peak)}" + (f" ({peak / low:.1f}x {low_phase})" if phase != low_phase and
                                                  peak >= 1.2 * low else "")
             for phase, peak in list(peaks.items())[:shown]]
    return "memory by phase (peak): " + ", ".join(parts)


def engine_line(e: ev.EngineEvent) -> str:
    """A count the engine does not have (None: its metric renamed) reads "?", never 0."""
    def n(count: int | None) -> str:
        return "?" if count is None else str(count)

    kv = f"KV cache {100 * e.kv_cache:.0f} %" if e.kv_cache is not None else "KV cache ?"
    full = " (full: requests wait for room)" if e.kv_cache is not None and e.kv_cache >= 0.99 and e.waiting else ""
    return (f"engine {e.engine}: {n(e.running)} running, {n(e.waiting)} waiting, {kv}{full}, "
            f"{n(e.preemptions)} preempted, {n(e.generated)} tokens generated")
