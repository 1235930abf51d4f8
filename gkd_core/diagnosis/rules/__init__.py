"""The rules: each a small pure function of the RunState and ``now`` that returns the alerts that
hold now, with its evidence and its hint in one place.

The hints are the fixes that the hang write-ups this project grew from give for each case (verl's
recipe/gkd hangs, a hang flow chart, a Ray self-play guide, LightRFT's troubleshooting guide),
said as what to do, not where it was read.

The rules, by what they watch: ``workers``, ``sync`` (and the collectives), ``gpu``, ``memory``,
``teacher``, ``placement`` (Ray's), ``pipeline`` (a producer that died); what they share: ``common``.
The wait-for graph's (``waits``) runs after them, as ``diagnose`` calls it: it prunes what they found.
"""

from __future__ import annotations

from collections.abc import Callable

from gkd_core import vocab
from gkd_core.diagnosis.rules.common import Settings
from gkd_core.diagnosis.rules.gpu import bad_step, gpu_danger, gpu_probe_hung, out_of_memory
from gkd_core.diagnosis.rules.memory import memory_growing, node_memory_low, oom_killed
from gkd_core.diagnosis.rules.pipeline import producer_died
from gkd_core.diagnosis.rules.placement import placement_groups, unschedulable
from gkd_core.diagnosis.rules.sync import collectives, parts_explain, sync, sync_parts
from gkd_core.diagnosis.rules.teacher import teacher
from gkd_core.diagnosis.rules.workers import (
    actor_dead,
    driver_failed,
    events_dropped,
    heartbeat_stale,
    no_progress,
    slower_than_peers,
    stragglers,
)
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent

__all__ = ["CODES", "LIVE", "RULES", "Settings", "heartbeat_stale", "parts_explain"]

RULES: list[Callable[[RunState, float, Settings], list[AlertEvent]]] = [
    heartbeat_stale, stragglers, slower_than_peers, sync, sync_parts, collectives, teacher, no_progress, actor_dead,
    unschedulable, placement_groups, gpu_probe_hung, gpu_danger,
    bad_step, out_of_memory, memory_growing, node_memory_low, oom_killed, driver_failed, events_dropped,
    producer_died,
]
# codes these rules own: the supervisor clears them when their rule no longer returns them
CODES = vocab.codes(by="rules")
# codes whose message carries a growing number: re-sent only when severity, verdict or place change
LIVE = vocab.codes(live=True)
