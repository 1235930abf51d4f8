"""Small renderings shared by the panes: durations, sizes, sparklines."""

from __future__ import annotations

from gkd_tui.render_text import fmt_duration

SPARK = "▁▂▃▄▅▆▇█"

__all__ = ["fmt_duration", "fmt_bytes", "sparkline"]


def fmt_bytes(n: int | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024:
            return f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}P"


def sparkline(values: list[float], width: int = 24) -> str:
    vals = [v for v in values if v is not None][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = (hi - lo) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1)))] for v in vals)
