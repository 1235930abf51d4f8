"""The processes a bundle takes stacks of: every live one of the job when it is written, not only those its
dump named.

The dump a bundle asks for first (``dump_stacks`` of every worker, the same fan-out as `D`) names the workers
the run's state held when it was asked. While the rest of the bundle is gathered (the probe imports torch and
asks Ray: seconds) more workers join, and an actor is alive in Ray's view before it has said who it is to the
run (a worker still starting, or one that does not report at all). So, once the rest is gathered, the union:

- the run's live workers, read again, that the dump did not name;
- every ALIVE actor of Ray's view (the probe's, with its pid) that no target is already: neither a worker with
  its actor id nor, on this machine, one with its pid. It is named by its class, its Ray name and its pid, and
  the summary lists it. Only the job's own: on a cluster shared with other jobs, an actor of a Ray job that
  none of the run's known actors belongs to is another job's, and left alone.

Those on this machine are taken here the way the supervisor takes a command run's (node/stacks.py: py-spy,
else the faulthandler file a watched process registered), and saved beside the dump's; each other one says
why not ("not taken: ..." in the summary).
"""

from __future__ import annotations

import dataclasses
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gkd_core.bundle.report import StacksTaken, UnreportedActor
from gkd_core.node.stacks import TIMEOUT_S, capture_many
from gkd_core.state import RunState

OURS = frozenset({"GkdStacksHelper"})  # our helper on a node (integrations/remote_stacks.py): not the job's
UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class Missed:
    """What the bundle's dump missed: targets to take here (target -> pid), and why each other one cannot be."""

    pids: dict[str, int] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    unreported: list[UnreportedActor] = field(default_factory=list)


def missed(stacks: StacksTaken, state: RunState, ray: dict[str, Any] | None, host: str) -> Missed:
    """The targets the dump ``stacks`` did not name: ``state``'s live workers (read again) and the ALIVE actors of
    ``ray`` (the probe's view: actors with their pid and node, nodes with ``here``) that are no target yet.
    ``host``: this machine's name, as the run's state gives a worker's node."""
    out = Missed()
    named = set(stacks.taken) | set(stacks.missing)
    for src, w in sorted(state.workers.items()):
        if src in named or w.phase == "exited":
            continue
        if not w.pid:
            out.missing[src] = f"{src} joined while the bundle was made and has not said its pid"
        elif w.node in (host, ""):
            out.pids[src] = w.pid
        else:
            out.missing[src] = (f"{src} joined while the bundle was made, on {w.node}: "
                                f"`py-spy dump --native --pid {w.pid}` there")
    targets = [w for s, w in state.workers.items() if s in named or s in out.pids or s in out.missing]
    known_actors = {w.actor_id for w in targets if w.actor_id}
    pids_here = {w.pid for w in targets if w.pid and w.node in (host, "")}
    if not ray or "error" in ray:
        return out
    nodes = {n.get("node_id", ""): n for n in ray.get("nodes") or []}
    actors = ray.get("actors") or []
    # the Ray jobs of the run's own actors (none known: every job's, as before there was a way to tell)
    jobs = {a.get("job_id") for a in actors if a.get("actor_id") in known_actors and a.get("job_id")}
    for a in sorted(actors, key=lambda a: (str(a.get("class") or ""), int(a.get("pid") or 0))):
        node = nodes.get(a.get("node_id") or "", {})
        here, pid = node.get("here") is True, int(a.get("pid") or 0)
        if a.get("state") != "ALIVE" or a.get("class") in OURS or a.get("actor_id") in known_actors or \
                (here and pid in pids_here) or (jobs and a.get("job_id") not in jobs):
            continue
        target = _name(a, pid, out.pids.keys() | out.missing.keys() | named)
        out.unreported.append(UnreportedActor(target=target, cls=a.get("class") or "", name=a.get("name") or "",
                                              actor_id=a.get("actor_id") or "", pid=pid,
                                              node=node.get("node_ip") or ""))
        if not pid:
            out.missing[target] = "Ray's view gives it no pid yet (its worker process is starting)"
        elif here:
            out.pids[target] = pid
            pids_here.add(pid)
        else:
            where = node.get("node_ip") or f"node {str(a.get('node_id') or '?')[:8]}"
            out.missing[target] = (f"it runs on {where}, not on this machine: `py-spy dump --native --pid {pid}` "
                                   "there" if "here" in node else
                                   f"Ray's view does not say whether {where} is this machine (pid {pid})")
    return out


def take_missed(run: Path, stacks: StacksTaken, state: RunState, ray: dict[str, Any] | None,
                host: str | None = None) -> StacksTaken:
    """``stacks`` with the stacks of what it missed (``missed``) taken here, each saved in the dump's folder too,
    and the others said."""
    more = missed(stacks, state, ray, host or socket.gethostname())
    if not more.pids and not more.missing and not more.unreported:
        return stacks
    taken, missing, notes = dict(stacks.taken), {**stacks.missing, **more.missing}, dict(stacks.notes)
    caps = capture_many(more.pids, TIMEOUT_S, faulthandler_dir=run / "stacks")
    folder = stacks.folder or f"stacks/{stacks.dump_id or 'bundle'}"
    for target, cap in sorted(caps.items()):
        if not cap.text:
            missing[target] = cap.error or f"nothing could be read of pid {cap.pid}"
            continue
        taken[target] = cap.text
        if cap.error:
            notes[target] = cap.error
        try:  # beside the dump's own, as the supervisor saves them (supervisor/local_stacks.py)
            (run / folder).mkdir(parents=True, exist_ok=True)
            (run / folder / (UNSAFE_IN_NAME.sub("_", target) + ".txt")).write_text(
                cap.text + (f"\n# note: {cap.error}\n" if cap.error else ""))
        except OSError as e:  # a full disk: the stack is still in stacks.txt, and says so
            notes[target] = "; ".join(filter(None, [cap.error, f"not saved in {folder}: {e}"]))
    return dataclasses.replace(stacks, folder=folder, taken=taken, missing=missing, notes=notes,
                               unreported=[*stacks.unreported, *more.unreported])


def _name(actor: dict[str, Any], pid: int, used: set[str]) -> str:
    """An actor's name in the bundle: its class, its Ray name where it has one, and its pid."""
    name = actor.get("class") or "actor"
    if actor.get("name"):
        name += f" '{actor['name']}'"
    name += f" pid {pid}" if pid else f" {str(actor.get('actor_id') or '?')[:8]}"
    return name if name not in used else f"{name} ({str(actor.get('actor_id') or '?')[:8]})"
