"""Rules on memory: a scope growing toward its limit, named before the OOM killer acts; a worker the OOM
killer ended, named as that after.

A scope is what the kernel's OOM killer acts on (gkd_core.memory): a cgroup with a limit (a container's,
a Slurm job's), else the node. Its use's growth is learned from its own readings (memory_growth), so a
scope that is big and flat is never warned; the worker named is the one in it that grew most since the
rise began.
"""

from __future__ import annotations

import os

from gkd_core.diagnosis import memory_growth
from gkd_core.diagnosis.marks import marked, on_node
from gkd_core.diagnosis.memory_growth import Growth
from gkd_core.diagnosis.rules.common import Settings
from gkd_core.state import RunState
from gkd_core.state.records import ScopeMemory
from gkd_core.state.views import heartbeat_at
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import size, spoken
from gkd_core.vocab import WORKER_ENDED

GROWING_MIN = 4 << 20  # bytes a second: slower than this is no growth worth a warning (a cache settling)
SUSTAINED_S = 9.0  # growing in every window for this long: a start-up's climb of a few seconds is not a leak
WARN_WITHIN_S = 90.0  # the limit this near at its growth: warned
CRITICAL_WITHIN_S = 20.0  # ... this near, or CRITICAL_FULL of it used: critical (either: a growth that slows
CRITICAL_FULL = 0.8  # as the kernel reclaims near the limit would flap a warning on the time alone)
FRESH_S = 5.0  # a scope or worker not heard from for longer says nothing of now
# the job's workers' growth under this share of the scope's: the rise is not theirs to be named for. A job's
# start, when Ray starts processes beside them, climbs by hundreds of MB a second while each grows by a few;
# another job on the node (a model loading) can climb for a minute while a worker beside it starts up. Most of
# the rise must be theirs; a node filled by others is node_memory_low's to say, near its end
JOB_SHARE = 0.5
NAMED_MAX = 3
# a node's available memory under this share of its total: warned; under NODE_CRITICAL, critical. Ray's memory
# monitor kills a worker at 95 % used (RAY_memory_usage_threshold), the kernel's OOM killer after it
NODE_WARN, NODE_CRITICAL = 0.10, 0.05

HINT = ("it grows toward its limit: its stack (d) shows what allocates; if it is expected, give the job more "
        "memory or restart smaller (r: the OOM ladder: micro-batch, the engine's memory share, offload)")


def where(s: ScopeMemory) -> str:
    return "the node's memory" if s.scope == "node" else f"its cgroup {short(s.scope)}"


def short(scope: str) -> str:
    """A cgroup's folder as a person names it: its own name (the whole path is in the evidence)."""
    return os.path.basename(scope.rstrip("/")) or scope


def memory_growing(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A scope whose use has grown for SUSTAINED_S toward its limit, named by the worker in it that grew
    fastest since the rise began: warned with the projected time, critical when close."""
    index = memory_growth.index_of(state, _near_limit)
    with index.lock:
        index.observe(state)
        out = []
        for key in sorted(index.near, key=index.near.__getitem__):
            s, g = state.mem_scopes.get(key), index.scopes[key].growth
            if (s is None or g.rising_since is None or now - g.rising_since < SUSTAINED_S or g.rate < GROWING_MIN
                    or s.limit <= 0 or now - s.ts > FRESH_S):
                continue
            within = max(s.limit - s.used, 0) / g.rate
            full = s.used / s.limit
            if within > WARN_WITHIN_S and full < CRITICAL_FULL:
                continue
            growers = [(r, state.workers[src]) for r, src in index.growers(state, key) if r >= GROWING_MIN / 2]
            growers = [(r, w) for r, w in growers
                       if w.phase not in WORKER_ENDED and now - heartbeat_at(state, w) <= FRESH_S]
            if not growers or sum(r for r, _ in growers) < JOB_SHARE * g.rate:
                continue  # growth by something that is not the job's workers (processes starting: Ray's own)
            growers = growers[:NAMED_MAX]
            (top_rate, top), others = growers[0], growers[1:]
            out.append(AlertEvent(
                severity="critical" if within <= CRITICAL_WITHIN_S or full >= CRITICAL_FULL else "warn",
                code="memory_growing",
                message=f"{top.src}: {size(top.rss)}, +{size(top_rate)}/s; {where(s)} {size(s.used)} of "
                        f"{size(s.limit)}: the limit in about {spoken(within)}"
                        + "".join(f"; {w.src} +{size(r)}/s" for r, w in others),
                hint=HINT, targets=[top.src],  # one: the alert stays one alert while the others' rates move
                evidence={"scope": s.scope, "node": s.node, "used": s.used, "limit": s.limit,
                          "rate": round(g.rate), "within_s": round(within, 1), "growers": [w.src for _, w in growers]}))
    return out


def oom_killed(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A worker the OOM killer ended (its scope's count of kills went up after its last heartbeat), with
    its memory then and the phase it was in: the cause of what failed after it, not a plain death."""
    out = []
    for w in marked(state, "oom_killed"):
        k = w.oom_killed
        if k is None:
            continue
        phase = w.ended_in if w.phase == "exited" and w.ended_in else w.phase
        limit = f" of {size(w.mem.limit)}" if w.mem is not None and w.mem.limit else ""
        scope = "the node" if k.scope == "node" else f"cgroup {short(k.scope)}"
        out.append(AlertEvent(
            severity="critical", code="oom_killed",
            message=f"{w.src} was killed by the OOM killer ({scope}: its kills {k.kills_before} -> {k.kills_after}) "
                    f"at {size(w.rss)}{limit}, in {phase or 'no phase'}",
            hint="out of memory: restart smaller (r: the OOM ladder: micro-batch, the engine's memory share, "
                 "offload) or give the job more memory; its growth before the kill is in the memory plot",
            targets=[w.src], evidence={"verdict": "dead", "scope": k.scope, "rss": w.rss}))
    return out


def _near_limit(s: ScopeMemory, g: Growth) -> bool:
    """A rising scope that may be named, by its reading and its growth (how long it rose and how fresh the reading
    is are the rule's to judge at ``now``)."""
    return (g.rate >= GROWING_MIN and s.limit > 0
            and (max(s.limit - s.used, 0) / g.rate <= WARN_WITHIN_S or s.used / s.limit >= CRITICAL_FULL))


def node_memory_low(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A node whose available memory is under NODE_WARN of its total, named by its largest workers: whoever
    is killed there next (by Ray's memory monitor or the kernel) may not be the one that took the memory."""
    out = []
    for node, s in state.kept("low_nodes", lambda: LowNodes(state)).low_now(state, now):
        share = s.available / s.limit
        on_it = sorted((w for w in on_node(state, node) if w.phase not in WORKER_ENDED
                        and w.rss and now - heartbeat_at(state, w) <= FRESH_S), key=lambda w: -w.rss)[:NAMED_MAX]
        if not on_it:
            continue
        out.append(AlertEvent(
            severity="critical" if share < NODE_CRITICAL else "warn", code="node_memory_low",
            message=f"node {node}: {size(s.available)} of {size(s.limit)} available ({share:.0%}); the largest "
                    "here: " + ", ".join(f"{w.src} {size(w.rss)}" for w in on_it),
            hint="Ray's memory monitor kills a worker at 95 % used and the kernel's OOM killer after it, not "
                 "always the one that grew: free the node (another job? a cache?) or restart smaller (r)",
            targets=[on_it[0].src],
            evidence={"node": node, "available": s.available, "total": s.limit,
                      "largest": {w.src: w.rss for w in on_it}}))
    return out


class LowNodes:
    """The nodes whose newest reading of their memory is low (NODE_WARN), kept from the scopes' feed: a pass reads
    the readings that are low or say a low node is no more, not every node's (16,384 of them at the largest)."""

    def __init__(self, state: RunState):
        self._low: dict[str, str] = {}  # node -> its scope's key
        self._feed = state.scope_feed(wants=self._wants)
        self._read_all = True

    def _wants(self, s: ScopeMemory) -> bool:
        """A reading that may change what this index holds (the reducer asks, at each)."""
        return s.scope == "node" and (s.available < NODE_WARN * s.limit or s.node in self._low)

    def keep_up(self, state: RunState, most: int) -> None:
        """Between passes: ``most`` of the scopes with a new reading (``diagnosis.keep_up``)."""
        if not self._read_all:
            self._readings(state, self._feed.take(most))

    def low_now(self, state: RunState, now: float) -> list[tuple[str, ScopeMemory]]:
        """(node, its reading) of each node low now, by name (a reading older than FRESH_S says nothing of now)."""
        keys = self._feed.take()
        if self._read_all:
            keys, self._read_all = set(state.mem_scopes), False
        self._readings(state, keys)
        out = []
        for node, key in sorted(self._low.items()):
            s = state.mem_scopes.get(key)
            if s is not None and now - s.ts <= FRESH_S:
                out.append((node, s))
        return out

    def _readings(self, state: RunState, keys: set[str]) -> None:
        for key in keys:
            s = state.mem_scopes.get(key)
            if s is not None and s.scope == "node" and s.limit > 0 and s.available < NODE_WARN * s.limit:
                self._low[s.node] = key
            elif s is None or s.scope == "node":
                node = s.node if s is not None else key.partition("|")[0]
                if self._low.get(node) == key:
                    del self._low[node]
