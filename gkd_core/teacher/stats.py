"""A bounded window of latencies with p50/p95/p99."""

from __future__ import annotations

import collections


class LatencyWindow:
    def __init__(self, keep: int = 512):
        self._values: collections.deque[float] = collections.deque(maxlen=keep)

    def add(self, ms: float) -> None:
        self._values.append(ms)

    def quantiles(self) -> dict[str, float]:
        if not self._values:
            return {}
        v = sorted(self._values)
        return {"p50": round(v[len(v) // 2], 3), "p95": round(v[min(len(v) - 1, int(0.95 * len(v)))], 3),
                "p99": round(v[min(len(v) - 1, int(0.99 * len(v)))], 3)}
