"""The words of an alert's evidence that are read back across rules, typed.

An alert's evidence (``AlertEvent.evidence``) is free-form on the wire: whoever says an alert (a driver, a job's
plugin) says what backs it, and each rule its own numbers (its message and the bug report show them as they
are). The few words read back by other rules and by the reducer are read here, whatever a sender put there:
the supervisor's loop must not die of a stranger's evidence (tests/fuzzing.py sends it anything).
"""

from __future__ import annotations

from typing import Any


def blocked_of(evidence: dict[str, Any]) -> list[str]:
    """The workers the alert's cause holds up (``blocked``: the cascade adds it to whichever alert names a cause)."""
    got = evidence.get("blocked")
    return [b for b in got if isinstance(b, str)] if isinstance(got, list) else []


def elapsed_of(evidence: dict[str, Any], missing: float) -> float:
    """``elapsed_s``, how long the finding has held, when it is a number; ``missing`` otherwise."""
    v = evidence.get("elapsed_s", missing)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else missing
