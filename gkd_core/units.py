"""How durations and sizes are written, in one place: the dashboard's compact cells and the words of
the diagnosis' messages."""

from __future__ import annotations

import math


def compact(seconds: float | None) -> str:
    """A table cell: 4.2s, 37s, 6m05s, 2h03m; "-" for none."""
    if seconds is None or not math.isfinite(seconds):  # inf: a difference of two absurd timestamps
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def spoken(seconds: float) -> str:
    """A message's words for a long wait: 5 s, 95 s, 2.5 min, 1.5 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def precise(seconds: float) -> str:
    """A message's words for a short time, where the digits matter: 20 ms, 0.35 s, 7.12 s, then spoken."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.2f} s" if seconds < 10 else spoken(seconds)


def size(n: float) -> str:
    """Bytes: 512 B, 1.2 MB, 80.0 GB."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"
