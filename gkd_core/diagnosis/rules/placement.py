"""Rules on Ray's placement: an actor or a placement group that Ray has not placed, and why it cannot."""

from __future__ import annotations

from gkd_core.diagnosis.marks import marked
from gkd_core.diagnosis.rules.common import Settings
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken
from gkd_core.vocab import WORKER_ENDED

PENDING_S = 30.0  # an actor Ray could place but has not, after this long, is worth a word


def _res(r: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(r.items())) or "nothing"


def unschedulable(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Actors Ray cannot create (workers stuck at init): a demand no node can meet, said with the
    numbers, or a demand that waits for resources others hold."""
    groups: dict[tuple, list] = {}
    for w in marked(state, "pending_creation"):
        if w.phase not in WORKER_ENDED:
            groups.setdefault((w.role, tuple(sorted(w.ray_required.items()))), []).append(w)
    alive = [n.resources for n in state.ray_nodes.values() if n.state == "ALIVE"]
    out = []
    for (role, req), ws in sorted(groups.items()):
        need = dict(req)
        waited = now - min(w.phase_since for w in ws)
        names = [w.src for w in ws]
        who = f"{len(ws)} {role} actor{'s' if len(ws) > 1 else ''}"
        lacking = {k: v for k, v in need.items() if alive and v > max(n.get(k, 0.0) for n in alive)}
        if lacking:
            best = {k: max(n.get(k, 0.0) for n in alive) for k in lacking}
            out.append(AlertEvent(
                severity="critical", code="unschedulable", targets=names,
                message=f"{who} cannot be scheduled: each asks for {_res(need)}; no node has {_res(lacking)} "
                        f"(the largest of {len(alive)} node{'s' if len(alive) > 1 else ''} has {_res(best)})"
                        + (f"; pending {spoken(waited)}" if waited >= 1 else ""),
                hint="lower the request (num_gpus, resources=) or add a node "
                     "that has it; `ray status` lists the demands Ray cannot meet",
                evidence={"required": need, "largest": best, "nodes": len(alive), "elapsed_s": round(waited, 1)}))
        elif waited > PENDING_S:
            out.append(AlertEvent(
                severity="warn", code="unschedulable", targets=names,
                message=f"{who} pending for {spoken(waited)}: each asks for {_res(need)}, which a node has but "
                        "others hold",
                hint="other actors or placement groups hold the resources: `ray status`; fewer workers or "
                     "smaller requests",
                evidence={"required": need, "elapsed_s": round(waited, 1)}))
    return out


PG_PENDING_S = 10.0  # a placement group that could be placed but is not, after this long: said


def _fits(need: dict[str, float], have: dict[str, float]) -> bool:
    return all(v <= have.get(k, 0.0) + 1e-9 for k, v in need.items())


def _bundles(bundles: list[dict[str, float]]) -> str:
    """``{CPU 10} × 2`` for equal bundles, else each."""
    shown = [f"{{{_res(b)}}}" for b in bundles]
    if len(shown) == 1:
        return shown[0]
    return f"{shown[0]} × {len(shown)}" if len(set(shown)) == 1 else " + ".join(shown)


def never_placed(bundles: list[dict[str, float]], strategy: str, nodes: list[dict[str, float]]) -> str:
    """Why a placement group can never be placed on ``nodes`` (their total resources), or "" when it can."""
    if not nodes:
        return ""
    for b in bundles:
        if not any(_fits(b, n) for n in nodes):
            lacking = {k: v for k, v in b.items() if v > max(n.get(k, 0.0) for n in nodes)}
            best = {k: max(n.get(k, 0.0) for n in nodes) for k in (lacking or b)}
            return (f"no node has {_res(lacking or b)} "
                    f"(the largest of {len(nodes)} node{'s' if len(nodes) > 1 else ''} has {_res(best)})")
    if strategy == "STRICT_PACK":
        total: dict[str, float] = {}
        for b in bundles:
            for k, v in b.items():
                total[k] = total.get(k, 0.0) + v
        if not any(_fits(total, n) for n in nodes):
            return f"STRICT_PACK puts them on one node, and no node has {_res(total)}"
    if strategy == "STRICT_SPREAD" and len(bundles) > len(nodes):
        return f"STRICT_SPREAD needs {len(bundles)} nodes, the cluster has {len(nodes)}"
    return ""


def placement_groups(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Placement groups Ray has not placed (a worker group that never starts, seed 003): a demand no
    node can meet, said at once with the numbers; one that waits for resources others hold, said once
    Ray says it found none free (NO_RESOURCES), or after PG_PENDING_S."""
    nodes = [n.resources for n in state.ray_nodes.values() if n.state == "ALIVE"]
    out = []
    for pg_id, pg in state.ray_pgs.items():
        if pg.state not in ("PENDING", "RESCHEDULING"):
            continue
        name = f"pg/{pg.name or pg_id[:12]}"
        asks = f"{_bundles(pg.bundles)}" + (f" ({pg.strategy})" if pg.strategy else "")
        waited = now - pg.since
        why = never_placed(pg.bundles, pg.strategy, nodes)
        if why or pg.scheduling == "INFEASIBLE":
            out.append(AlertEvent(
                severity="critical", code="unschedulable", targets=[name],
                message=f"placement group {pg.name or pg_id[:12]} can never be placed: it asks for {asks}; "
                        + (why or "Ray says no node of the cluster can host it")
                        + (f"; pending {spoken(waited)}" if waited >= 1 else ""),
                hint="its workers will never start: lower the demand (verl: trainer.n_gpus_per_node, "
                     "RayResourcePool's max_colocate_count, which asks that many CPUs per worker) or add a node "
                     "that has it; `ray status` lists the demands Ray cannot meet",
                evidence={"bundles": pg.bundles, "strategy": pg.strategy, "nodes": len(nodes),
                          "elapsed_s": round(waited, 1), "ray_says": pg.scheduling}))
        elif pg.scheduling == "NO_RESOURCES" or waited > PG_PENDING_S:  # Ray tried, and found them held
            out.append(AlertEvent(
                severity="warn", code="unschedulable", targets=[name],
                message=f"placement group {pg.name or pg_id[:12]} pending for {spoken(waited)}: it asks for {asks}, "
                        "which the cluster has, but others hold it now",
                hint="it starts when they let go: another job or pool holds the resources (`ray status`); "
                     "fewer workers or smaller requests start it now",
                evidence={"bundles": pg.bundles, "strategy": pg.strategy, "elapsed_s": round(waited, 1),
                          "ray_says": pg.scheduling}))
    return out
