"""Training: loss, KL, agreement sparklines as wide as the pane, tokens/s, the gradient norm, what the
samples look like and where each step's time goes."""

from __future__ import annotations

from rich.text import Text

from gkd_core.state import RunState
from gkd_tui.widgets.format import sparkline
from gkd_tui.widgets.pane import Pane
from gkd_tui.widgets.styles import FAILURE, SERIES

LABEL = 19  # "loss        0.1234 " before a sparkline


class MetricsPane(Pane):
    def show(self, st: RunState, now: float) -> None:
        # the sparklines take the pane's width, a step a cell (p: the whole run, plotted)
        width = max(8, self.content_size.width - LABEL)
        ms = st.recent_metrics(width)
        t = Text()
        if not ms:
            t.append("no metrics yet", style="dim")
            self.put(t)
            return
        last = ms[-1]
        for name in ("loss", "kl", "agreement"):
            vals = [getattr(m, name) for m in ms]
            cur = getattr(last, name)
            if cur is None:
                continue
            label = f"{name:9s} {cur:8.4f} "  # wider than LABEL past 1000 (or -100): the sparkline gives way
            t.append(label)
            t.append(sparkline(vals, max(8, self.content_size.width - len(label))), style=self.tone(SERIES[name]))
            t.append("\n")
        if last.tokens_per_s:
            t.append(f"tokens/s  {last.tokens_per_s:8.0f}")
            t.append(f"  epoch {last.epoch:.2f}\n" if last.epoch is not None else "\n")
        if last.grad_norm is not None:
            t.append(f"grad norm {last.grad_norm:8.3g}", style=self.tone(FAILURE if last.skipped else None))
            if last.bad_steps:
                t.append(f"  {last.bad_steps} bad step(s) skipped", style=self.tone(FAILURE))
            t.append("\n")
        if last.completion_len is not None:
            t.append(f"samples   {last.completion_len:5.1f} tokens, {100 * (last.eos_share or 0):.0f}% reach EOS, "
                     f"{100 * (last.sample_agreement or 0):.0f}% agree\n", style="dim")
        if last.timing:
            total = sum(last.timing.values()) or 1.0
            t.append("step " + "  ".join(f"{k} {v:.2f}s" for k, v in last.timing.items()), style="dim")
            t.append(f"  ({total:.2f}s)", style="dim")
        self.put(t)
