"""Deaths by the OOM killer, found where they happen: a worker on this node that fell silent or ended while
the OOM killer's count in its memory scope went up since its last heartbeat (gkd_core.memory) is said as
an ``oom_killed`` event, once. Its own process can say nothing after a SIGKILL; the scope's count can, and
the supervisor reads it beside the job (on other nodes, their scopes are not readable from here)."""

from __future__ import annotations

import os
from collections.abc import Callable

from gkd_core import memory
from gkd_core.diagnosis.marks import on_node
from gkd_core.state import RunState
from gkd_core.state.views import heartbeat_at
from gkd_core.telemetry import events as ev
from gkd_core.vocab import WORKER_ENDED

SILENT_BEATS = 3  # a worker this many heartbeat periods quiet may be dead: its scope is read
# ... and read again each pass until this long after its last heartbeat: a process at its cgroup's limit goes
# quiet while the kernel reclaims, seconds before the OOM killer counts its kill
WATCH_GONE_S = 30.0
DIED = ("exited", "failed")  # not "finished" or "cancelled": a worker that ended on its own was not killed


class OomWatch:
    """The workers of one node whose scope's kills went up while they were gone. The kernel kills the
    largest process (its oom_score is mostly its size): when more are gone than it killed (a job's driver
    that failed on the kill, the actors its end took down), the kills go to the largest, one each."""

    def __init__(self, emit: Callable[[ev.Event], None], heartbeat_s: float, read: memory.Read = memory.read_file):
        self.emit, self.heartbeat_s, self.read = emit, heartbeat_s, read
        self.node = os.uname().nodename
        self._explained: dict[str, int] = {}  # scope -> its kills so far that were said of a worker

    def check(self, state: RunState, now: float) -> None:
        """``now``: wall-clock seconds, as the events' ``ts``."""
        gone: dict[str, list] = {}
        for w in on_node(state, self.node):  # (of 131,072 at the largest, the few here)
            m = w.mem
            if m is None or m.oom_kills is None or w.oom_killed is not None:
                continue
            if w.role == "driver" and (w.phase == "failed" or state.exit_code not in (None, -9, 137)):
                continue  # it said its own failure, or exited with a code: the OOM killer's SIGKILL leaves neither
            silent = now - heartbeat_at(state, w)
            if (w.phase in DIED or w.ray_state == "DEAD" or (w.phase not in WORKER_ENDED
                                                              and silent > SILENT_BEATS * self.heartbeat_s)) \
                    and silent <= WATCH_GONE_S:
                gone.setdefault(m.scope, []).append(w)
        in_cgroups = 0  # kills said of workers in a cgroup this check: the node's count holds them too
        for scope, ws in sorted(gone.items(), key=lambda item: item[0] == "node"):  # the cgroups first
            after = memory.oom_kills(scope, self.read)
            if after is None:
                continue
            base = min(w.mem.oom_kills for w in ws)
            unexplained = after - max(base, self._explained.get(scope, base))
            if scope == "node":
                unexplained -= in_cgroups
            if unexplained <= 0:
                continue
            self._explained[scope] = after
            for w in sorted((w for w in ws if w.mem.oom_kills < after), key=lambda w: -w.rss)[:unexplained]:
                self.emit(ev.OomKilledEvent(worker=w.src, scope=scope, kills_before=w.mem.oom_kills,
                                            kills_after=after))
                in_cgroups += scope != "node"
