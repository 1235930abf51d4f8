"""Plain-text renderings of a RunState, for `gkd-tui status` and logs without a TTY."""

from __future__ import annotations

from pathlib import Path

from gkd_core.diagnosis.holds import what_holds
from gkd_core.state import RunState
from gkd_core.state.views import shown_phase
from gkd_core.units import compact as fmt_duration
from gkd_core.vocab import RUN_ENDED


def status_text(st: RunState, now: float, run: Path | None = None) -> str:
    step = f"{st.step if st.step is not None else '-'}/{st.total_steps or '?'}"
    lines = [f"run {st.run or '?'}  {st.state or 'unknown'}  step {step}  elapsed "
             f"{fmt_duration(now - st.started if st.started else None)}  restarts {st.restarts}"]
    if run is not None:
        lines.append(f"dir {run}")
    if st.state in RUN_ENDED and st.reason:
        lines.append(f"driver {st.reason}")
    lines.append(f"recovery {st.recovery or 'off (a person restarts it: --restart-on CODE to have it done)'}")
    for a in st.active_alerts()[:5]:
        lines.append(f"{a.severity.upper():8s} {a.message}")
        if a.hint:
            lines.append(f"         -> {a.hint}")
    held = what_holds(st, now)
    if held:
        lines.append(f"held by  {held}")
    view = st.sync_view(now)
    if view is not None:
        pend = f"  pending {', '.join(view.pending)}" if view.pending else ""
        lines.append(f"sync {view.sync_id} {view.state}  {fmt_duration(view.elapsed_s)} / "
                     f"{fmt_duration(view.timeout_s)}{pend}")
    if st.workers:
        name_w = max(14, min(24, max(len(s) for s in st.workers)))
        phase_w = max(14, min(24, max(len(shown_phase(w)) for w in st.workers.values())))
        lines.append(f"{'worker':{name_w}s} {'pid':>7s} {'phase':{phase_w}s} {'in phase':>9s} {'step':>5s} "
                     f"{'heartbeat':>9s}")
        for ws in st.workers_by_role().values():
            for w in ws:
                hb = st.heartbeat_age(w, now)
                lines.append(f"{w.src:{name_w}s} {w.pid or '-':>7} {shown_phase(w)[:phase_w]:{phase_w}s} "
                             f"{fmt_duration(st.time_in_phase(w, now)):>9s} "
                             f"{w.step if w.step is not None else '-':>5} {fmt_duration(hb):>9s}")
    if st.metrics:
        m = st.metrics[-1]
        parts = [f"{k} {getattr(m, k):.4g}" for k in ("loss", "kl", "agreement", "tokens_per_s")
                 if getattr(m, k) is not None]
        lines.append(f"metrics step {m.step}: " + ("  ".join(parts) or "(timing only)"))
    return "\n".join(lines)
