"""Workers started again in their place while the run goes on: a teacher actor Ray reports dead, a node agent,
and (``trainer.replace_rollouts``) a rollout worker that died, whose part of the step is then done again.

A rollout's death fails the wait on it (``WorkerFailed``, ``died``); ``RolloutReplacer.retried`` starts it again
under the same name, makes the collective group anew with it (the old group has a dead member), and does the call
again, after ``again`` (the student's weights synced to the new one, the batch it was generating sent again). A
frozen rollout is the same once it is stopped: the recovery stops it (``cancel`` with force) rather than restart
the run, because its registration says its driver replaces it (``WorkerEvent.replaceable``). Each replacement is
said to the run as it happens: ``restarted_by_driver``, warned while the new one starts, cleared once it is up.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TypeVar

import ray

from gkd_core.node.agent import start_agents
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer.cluster import Cluster
from gkd_core.trainer.guarded import WorkerFailed
from gkd_core.vocab import WorkerId, src_of

# one call whose rollouts died this many times, each replaced, and failing again: the run fails (a worker that
# cannot live, say out of memory at every start, is a restart's or a person's to handle, not a loop's)
REPLACES_PER_CALL = 2
START_HINT = "check RUN/logs/driver.log for an import or memory error"

T = TypeVar("T")


def said_dead(rep: Reporter, dead: list[str], doing: str, cleared: bool = False) -> None:
    """An actor the driver finds dead and starts again is named as dead at once: the new one registers
    under its name within seconds, before a silence or Ray's word of the old one could name it. Cleared
    once the new one is up."""
    names = ", ".join(sorted(dead))
    rep.emit(ev.AlertEvent(
        severity="warn", code="restarted_by_driver", targets=sorted(dead), cleared=cleared,
        message=f"{names} died and the driver started it again" if cleared else
                f"{names} died (Ray reports the actor dead): the driver is {doing}",
        hint="read its log (enter on it) for why; out of memory, killed from outside, or stopped by the recovery "
             "(frozen)?"))


def revive_agents(c: Cluster) -> list[str]:
    """Node agents that Ray reports dead, started again on their nodes; returns their labels.
    Until then a node has no GPU readings and its stacks come from the workers themselves."""
    dead = c.dead({f"agent {node}": h for node, h in c.agents.items()})
    nodes = {n.removeprefix("agent ") for n in dead}
    if not nodes:
        return []
    labels = [c.node_labels.get(n, n[:8]) for n in nodes]
    for n in nodes:
        c.agents.pop(n)
        c.forget_probe(f"agent {n}")
    c.rep.log(f"node agent(s) on {', '.join(labels)} died: starting them again", level="warn")
    said_dead(c.rep, [src_of("agent", label) for label in labels], "starting them again on their nodes")
    a = c.cfg.agent
    try:
        agents, _ = start_agents(c.route, c.rep.run, c.run_dir, gpu_backend=c.faults.gpu_backend(a.gpu_backend),
                                 gpu_interval_s=a.gpu_interval_s, nvml_deadline_s=a.nvml_deadline_s,
                                 heartbeat_s=c.cfg.telemetry.heartbeat_s, only=nodes)
    except Exception as e:  # never the reason a run stops
        c.rep.log(f"node agents did not start again ({type(e).__name__}: {e})", level="warn")
        return []
    c.agents.update(agents)
    said_dead(c.rep, [src_of("agent", label) for label in labels], "", cleared=True)
    return labels


def revive_teacher(c: Cluster, dead: list[str]) -> list[str]:
    """Start the dead teacher actors again; returns who was started. A dead proxy takes its
    workers with it: they serve its backend address, which a new proxy does not keep."""
    if not dead:
        return []
    again = ["teacher/proxy", *c.teacher_workers()] if "teacher/proxy" in dead else dead
    for n in again:
        ray.kill(c.actors.pop(n), no_restart=True)
        c.forget_probe(n)
    with c.rep.phase("init", detail=f"starting {', '.join(again)} again"):
        c.rep.log(f"{', '.join(dead)} died: starting {', '.join(again)} again", level="warn")
        said_dead(c.rep, dead, f"starting {', '.join(again)} again")
        c.start_teacher()
        c.info.update(c.wait({n: c.actors[n].ready.remote() for n in again}, c.cfg.trainer.init_timeout_s, "init",
                             hint=START_HINT))
    said_dead(c.rep, dead, "", cleared=True)
    return again


def replace_rollouts(c: Cluster, dead: list[str]) -> None:
    """Rollout workers that died, started again under their names, and the collective group made anew with
    them: the others are told to leave any collective of the old group first (a broadcast that lost a peer)."""
    names = ", ".join(dead)
    doing = f"starting {names} again in {'its' if len(dead) == 1 else 'their'} place; the run goes on"
    with c.rep.phase("init", detail=f"starting {names} again"):
        c.rep.log(f"{names} died: {doing}", level="warn")
        said_dead(c.rep, dead, doing)
        for n in dead:
            ray.kill(c.actors.pop(n), no_restart=True)  # (dead already: its process may linger a few seconds)
            c.info.pop(n, None)  # (a cancel aimed at the old process meanwhile finds none: never the new one)
            c.forget_probe(n)
            c.start_rollout(WorkerId.parse(n).rank or 0, again=True)
        c.info.update(c.wait({n: c.actors[n].ready.remote() for n in dead}, c.cfg.trainer.init_timeout_s, "init",
                             hint=START_HINT))
    group = c.group
    assert group is not None  # (made in ``Cluster.start_workers``, before any wait that replaces)
    for m, actor in group.members.items():
        if m in dead:
            group.members[m] = c.actors[m]
        else:
            actor.cancel.remote()
    group.rebuild()
    said_dead(c.rep, dead, "", cleared=True)


class RolloutReplacer:
    """``retried``: a call that waits on the rollouts, done again after a dead one is replaced (when the run
    replaces rollouts; otherwise the call's failure is the run's)."""

    def __init__(self, cluster: Cluster, enabled: bool):
        self.cluster, self.enabled = cluster, enabled
        self.replaced = 0  # rollouts replaced in this driver's life

    def retried(self, call: Callable[[], T], again: Callable[[], object] | None = None) -> T:
        """``call()``; when a rollout it waits on died, that rollout replaced and ``again()`` then ``call()``
        done again, at most REPLACES_PER_CALL times."""
        for tries in itertools.count():
            try:
                if tries and again is not None:
                    again()
                return call()
            except WorkerFailed as e:
                if not self.replaceable(e) or tries >= REPLACES_PER_CALL:
                    raise
                replace_rollouts(self.cluster, [e.name])
                self.replaced += 1
        raise AssertionError("unreachable")  # (itertools.count never ends: for the type checker)

    def replaceable(self, e: WorkerFailed) -> bool:
        return self.enabled and e.died and WorkerId.parse(e.name).role == "rollout"
