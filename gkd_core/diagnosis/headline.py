"""Why a driver ended, in one line of its log's tail: read by the `driver_failed` rule and by
``gkd_core run`` when it reports the end (the supervisor keeps the tail in the `run` event)."""

from __future__ import annotations


def headline(tail: list[str]) -> str:
    """The line of a log tail that best says why the driver ended: its own error, else an
    exception, else the last line."""
    for marks in (("gkd driver:",), ("Error", "Exception", "Killed")):
        for line in reversed(tail):
            if any(m in line for m in marks):
                return line.strip()
    return tail[-1].strip() if tail else ""
