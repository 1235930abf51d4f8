"""Recovery without a person (DESIGN §14): when a critical alert of a listed kind has held for its grace
period, the run is restarted, within a budget of restarts an hour and with a growing wait between them; once
the budget is spent it is not restarted again, and that is said loudly. Off unless asked for.

``RecoveryPolicy.decide`` is pure (the state, ``now`` and the restarts it made so far in, a decision out): the
supervisor carries a decision out (the bug report first, then the restart) and records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from gkd_core.state import RunState

HOUR_S = 3600.0


@dataclass(frozen=True)
class RecoveryPolicy:
    """``codes``: the alerts' codes that restart a run once one of them, critical, has held ``grace_s``; at most
    ``per_hour`` restarts in any hour, the n-th waiting ``backoff_s * 2**(n-1)`` after the one before."""

    codes: frozenset[str] = field(default_factory=frozenset)
    grace_s: float = 60.0
    per_hour: int = 3
    backoff_s: float = 30.0

    def __bool__(self) -> bool:
        return bool(self.codes)


class Decision(NamedTuple):
    """What to do now: ``restart`` for ``code`` on ``targets`` (held ``held_s``); or ``spent``: the budget is
    spent and nothing is done (said once)."""

    action: str  # "restart" or "spent"
    code: str
    targets: list[str]
    held_s: float
    reason: str


def decide(policy: RecoveryPolicy, st: RunState, now: float, made: list[float]) -> Decision | None:
    """The decision for now, or None (nothing held long enough, or the next restart's wait is not over).
    ``made``: when this policy restarted the run before (its times, oldest first)."""
    if not policy:
        return None
    held = [a for a in st.active_alerts() if a.severity == "critical" and a.code in policy.codes
            and now - a.since >= policy.grace_s]
    if not held:
        return None
    a = min(held, key=lambda a: a.since)
    lately = [t for t in made if now - t < HOUR_S]
    if len(lately) >= policy.per_hour:
        return Decision("spent", a.code, list(a.targets), now - a.since,
                        f"{len(lately)} restarts in the last hour (the budget is {policy.per_hour}): not restarted "
                        f"again; {a.code} has held {now - a.since:.0f} s")
    if made and now - made[-1] < policy.backoff_s * 2 ** (len(lately) - 1 if lately else 0):
        return None
    return Decision("restart", a.code, list(a.targets), now - a.since,
                    f"{a.code} on {', '.join(a.targets[:3]) or 'the run'} held {now - a.since:.0f} s (the grace "
                    f"period is {policy.grace_s:.0f} s): restart {len(lately) + 1} of {policy.per_hour} this hour")
