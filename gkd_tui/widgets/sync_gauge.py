"""The current weight sync: elapsed against its timeout, coloured at 50 % and 80 %, who is pending, and
where each member that has been a while in one part of it is (load into the engine 41 s, usually 0.2 s)."""

from __future__ import annotations

from rich.text import Text

from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.state import RunState
from gkd_core.state.views import usual_part_time
from gkd_core.units import precise
from gkd_core.vocab import SYNC_PARTS
from gkd_tui.widgets.format import fmt_duration
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import CAUTION, FAILURE, OK, TROUBLE

BAR = 24
MAX_GROUPS_SHOWN = 3
MAX_PARTS_SHOWN = 4
PART_SHOWN_AFTER_S = 1.0  # a member's part is shown once it has lasted this long (most take milliseconds)


def fraction_tone(frac: float, state: str) -> str:
    """The sync's colour: past its timeout or failed, then by the fraction of its timeout spent."""
    if state in ("timed_out", "failed"):
        return TROUBLE
    if state == "cancelled":
        return CAUTION
    return FAILURE if frac >= 0.8 else CAUTION if frac >= 0.5 else OK


class SyncGauge(Pane):
    def show(self, st: RunState, now: float) -> None:
        v = st.sync_view(now)
        t = Text()
        if v is None:
            t.append("no weight sync yet", style="dim")
            self._collectives(t, st, now)
            self.put(t)
            return
        frac = max(0.0, min(1.0, v.fraction))
        style = self.tone(fraction_tone(v.fraction, v.state))
        filled = int(frac * BAR)
        t.append(f"sync {v.sync_id} ")
        t.append(v.state, style=style)
        t.append(f"  {fmt_duration(v.elapsed_s)} / {fmt_duration(v.timeout_s)}\n")
        t.append("█" * filled, style=style)
        t.append("░" * (BAR - filled), style="dim")
        t.append(f" {100 * v.fraction:.0f}%\n")
        if v.pending:
            t.append("waiting for " if v.running else "stragglers: ", style="bold")
            t.append(", ".join(v.pending), style=self.tone(TROUBLE) if v.fraction >= 0.5 or not v.running else "bold")
            t.append("\n")
        if v.running and st.sync is not None:
            self._parts(t, st, now)
        recent = [s for s in st.sync_history if s.state == "done"][-6:]
        if recent:
            t.append("recent: " + " ".join(f"{s.elapsed_s:.2f}s" for s in recent), style="dim")
        if st.sync and st.sync.fingerprint_ok is False:
            t.append(f"\nweights differ after sync {st.sync.sync_id}: {', '.join(st.sync.differ) or '?'}",
                     style=self.tone(TROUBLE))
        self._collectives(t, st, now)
        self.put(t)

    def _parts(self, t: Text, st: RunState, now: float) -> None:
        """The members a while in one part of the sync, the longest first, each with that part's usual time."""
        assert st.sync is not None  # (said of the sync running)
        long = sorted(((now - at.since, member, at.part) for member, at in st.sync.parts_now.items()
                       if now - at.since >= PART_SHOWN_AFTER_S), reverse=True)
        for elapsed, member, part in long[:MAX_PARTS_SHOWN]:
            learned = usual_part_time(st.sync_history, part)
            usual = f" (usually {precise(learned[0])})" if learned else ""
            t.append(f"{member}: ", style="bold")
            t.append(f"{SYNC_PARTS.get(part, part)} {fmt_duration(elapsed)}{usual}\n",
                     style=self.tone(TROUBLE) if elapsed >= MIN_S else None)

    def _collectives(self, t: Text, st: RunState, now: float) -> None:
        """Each process group's newest collective: who is in, who is out (collectives: the rank that has
        not joined broadcast #N)."""
        for c in st.collective_views()[:MAX_GROUPS_SHOWN]:
            t.append(f"\n{c.op} #{c.seq} {c.group}: ", style="bold" if c.out or c.inside else "dim")
            if not c.out and not c.inside:
                t.append(f"all {len(c.left)} left", style="dim")
                continue
            late = now - c.since >= MIN_S
            t.append(f"in {len(c.inside) + len(c.left)}/{c.world}")
            if c.out:
                t.append(" · not joined: ", style="bold")
                t.append(", ".join(c.out[:4]) + (" …" if len(c.out) > 4 else ""),
                         style=self.tone(TROUBLE) if late else "bold")
            elif c.inside:
                t.append(f" · inside {fmt_duration(now - c.since)}: ", style="bold")
                t.append(", ".join(c.inside[:4]) + (" …" if len(c.inside) > 4 else ""),
                         style=self.tone(TROUBLE if late else None))
