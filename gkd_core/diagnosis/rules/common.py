"""What the rules share: their settings, the hint of each phase, a worker's last words."""

from __future__ import annotations

import re
from typing import NamedTuple

from gkd_core.config import TrainerConfig
from gkd_core.state import RunState
from gkd_core.state.liveness import Limits
from gkd_core.vocab import PAUSED


class Settings(NamedTuple):
    stall_s: float = 10.0  # a heartbeat older than this is stale
    heartbeat_s: float = 1.0  # how often workers send one: a silence is judged against it
    # a worker in a set-up phase (init, init_model, init_engine) that set no deadline of its own: how long it
    # may go without a heartbeat before that is critical (an import or a model load holds the GIL in C, a
    # busy node starves it); the driver's own wait for it ends then too (the supervisor passes the run's
    # trainer.init_timeout_s; this is its default)
    setup_s: float = TrainerConfig().init_timeout_s

    @property
    def limits(self) -> Limits:
        """The liveness judge's limits for these periods (``state.liveness``)."""
        return Limits(self.heartbeat_s, self.stall_s)


BAD_STEP_SHOWN = 50  # steps a skipped step stays on the dashboard after it

# phases that may take long by design (a checkpoint's write, a group's rendezvous, a resume, a dataset's
# preparation, a pause a person asked for): no step arrives meanwhile, and a checkpoint's pickling can hold the GIL
SLOW_ON_PURPOSE = ("checkpoint", "join_group", "resume", "load_data", PAUSED)


NCCL_TRY = ("NCCL_DEBUG=INFO to see where it stops; NCCL_IB_DISABLE=1 and NCCL_P2P_DISABLE=1 when the fabric is "
            "suspect; NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME set to the interface that carries the node IP")


PHASE_HINTS = {
    "sync_weights": "its peers left the weight sync, it did not; its stack says where. Cancel the sync (c) to "
                    "retry, or restart without it (r); on NCCL raise NCCL_TIMEOUT only if the stack moves",
    "generate": "the rollout engine is stuck or slow on this worker alone: its stack (d); out of memory or a bad GPU "
                "on its node? restart with one rollout worker fewer or smaller (r)",
    "load_data": "stuck loading data (`Generating train split` then silence): a datasets cache lock or a slow "
                 "file system; its stack (d) shows the file; remove the stale lock in the datasets cache",
    "join_group": f"joining the collective group: a member that never joins is stuck before it; {NCCL_TRY}",
    "init_engine": f"engine init far too long: GPU memory taken by another process, or NCCL; {NCCL_TRY}",
    "init_model": "model init far too long: a slow file system or out of host memory; its stack (d)",
    "init": f"init far too long: its stack (d); {NCCL_TRY}",
    "train": "the training step on this worker: its stack (d); out of memory? restart smaller (r)",
    "teacher_wait": "waiting for the teacher: see the teacher pane (sent vs received vs served)",
}


def phase_hint(phase: str) -> str:
    """The hint of a phase, by name or, for a Ray method, by what its name says it does."""
    if phase in PHASE_HINTS:
        return PHASE_HINTS[phase]
    name = phase.lower()
    for words, key in ((("sync", "weight"), "sync_weights"), (("broadcast",), "sync_weights"),
                       (("generate",), "generate"), (("load", "data"), "load_data"), (("init",), "init"),
                       (("train",), "train")):
        if all(w in name for w in words):
            return PHASE_HINTS[key]
    return "its stack (d) says where it waits; cancel it (c) or restart (r)"


def last_words(state: RunState, src: str) -> str:
    """What a worker that died was doing: its last phase, and where it stood in its collectives."""
    w = state.workers.get(src)
    if w is None:
        return ""
    phase = w.ended_in if w.phase == "exited" else w.phase  # marked exited when the run ended: the one before
    said = [f"its last phase {phase}" + (f" (step {w.step})" if w.step is not None else "")] if phase else []
    for group, members in sorted(state.collectives.items()):
        p = members.get(src)
        if p is not None and p.entered:
            inside = p.left is not None and p.left < p.entered
            said.append(f"{'inside' if inside else 'last in'} {p.op or 'collective'} #{p.entered} of group {group}")
    return "; ".join(said)


# how the driver names a worker that failed or died under a guarded wait
FAILED_WORKER = re.compile(r"^(\S+/\S+) \(.*?\) (?:failed in|died or was cancelled during) (\S+?):")
