"""Small renderings shared by the panes: durations, sizes, sparklines."""

from __future__ import annotations

import math

from gkd_tui.render_text import fmt_duration

SPARK = "▁▂▃▄▅▆▇█"

__all__ = ["fmt_duration", "fmt_bytes", "sparkline"]


def fmt_bytes(n: float | None) -> str:
    if not n:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024:
            return f"{n:.0f}{unit}"
        n /= 1024
    return f"{n:.0f}P"


def sparkline(values: list[float], width: int = 24) -> str:
    vals = [v for v in values if v is not None and math.isfinite(v)][-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    # in halves: the distance between two extreme finite values (a diverged loss of -1e308 and 1e308)
    # overflows to inf, and inf / inf is NaN, which no bar is; their halves' distance does not
    span = (hi / 2 - lo / 2) or 1.0
    top = len(SPARK) - 1
    return "".join(SPARK[max(0, min(top, int((v / 2 - lo / 2) / span * top)))] for v in vals)
