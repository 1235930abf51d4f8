"""The alert codes, each defined once: who raises it, and what the rest of the project does with it.

Rules, the cascade, the restart plan and the dashboard read their lists from ``ALERTS`` instead of
spelling the codes again; ``tests/unit/test_vocab.py`` checks that every code raised anywhere is here and
every code here is raised somewhere (or marked reserved).
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Raiser = Literal["rules", "supervisor", "driver", "ray_state"]


class Code(NamedTuple):
    by: Raiser  # "rules": a finding of the diagnosis, judged anew each pass and cleared when it no longer holds
    word: str = ""  # the worker table's word for a worker it names ("stale"); "" when it names none that way
    live: bool = False  # its message carries a growing number: re-sent only when severity, verdict or place change
    stacks: bool = False  # the workers it names get their stacks taken at once, and again a moment later
    cause: bool = False  # it names a cause: the workers held up by it are listed and marked blocked (cascade)
    late: bool = False  # it names a worker late or gone: the restart plan runs one rollout worker fewer
    reserved: bool = False  # raised by nothing yet: kept for a reader of older runs' logs, or a rule to come


ALERTS: dict[str, Code] = {
    "heartbeat_stale": Code("rules", "stale", live=True, stacks=True, cause=True, late=True),
    "straggler": Code("rules", "straggler", live=True, stacks=True, late=True),
    "slower_than_usual": Code("rules", "slow", live=True, stacks=True),
    "sync_slow": Code("rules", "sync slow", live=True),
    "sync_timed_out": Code("rules", "sync timed out", late=True),
    "sync_failed": Code("rules"),
    "fingerprint_mismatch": Code("rules"),
    "teacher_unreached": Code("rules", live=True, cause=True),
    "teacher_not_serving": Code("rules", live=True, stacks=True, cause=True),
    "no_progress": Code("rules", "no progress", live=True),
    "actor_dead": Code("rules", "dead", cause=True, late=True),
    "unschedulable": Code("rules", "unschedulable", live=True),
    "gpu_probe_hung": Code("rules", live=True),
    "gpu_idle_full": Code("rules", live=True),
    "gpu_unbalanced": Code("rules", live=True),
    "bad_step": Code("rules"),
    "out_of_memory": Code("rules", "out of memory"),
    "driver_failed": Code("rules", "failed"),
    "events_dropped": Code("rules"),
    "collective_not_joined": Code("rules", "not in collective", live=True, stacks=True, cause=True, late=True),
    "collective_stuck": Code("rules", "stuck in collective", live=True, stacks=True, cause=True),
    "ingest_rejected": Code("supervisor"),
    "auth_refused": Code("supervisor"),
    "restarted_by_driver": Code("driver", "restarted"),
    "disk_low": Code("driver"),
    "ray_unreachable": Code("ray_state"),
}


def codes(**having: object) -> tuple[str, ...]:
    """The codes whose fields equal ``having`` (``codes(by="rules")``, ``codes(live=True)``), in table order."""
    return tuple(c for c, k in ALERTS.items() if all(getattr(k, f) == v for f, v in having.items()))
