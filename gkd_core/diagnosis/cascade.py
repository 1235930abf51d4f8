"""Who a fault holds up: the workers that wait on the one an alert names, so that they are shown as blocked
by it, not as faults of their own.

One rank that dies or freezes inside a broadcast leaves every peer waiting in it, and each peer later
times out with an error of its own: the seeds' logs say "timeout" on every rank that was fine. The
alert that names the cause lists them under ``evidence["blocked"]``; the state marks each one
``blocked_by`` the cause while the alert holds (the workers table says "blocked by rollout/1"). Who
waits on whom is read from what the run said, not guessed from times:

- a collective: the peers inside a collective the cause has not completed (entered it later, or is in
  it and never came out);
- the teacher: the workers waiting for its logprobs (phase ``teacher_wait``) while a teacher worker or
  its proxy is the cause;
- a node agent: the workers whose events it relays (``heartbeat_stale`` lists them itself).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from gkd_core import vocab
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.telemetry.evidence import blocked_of
from gkd_core.vocab import WORKER_ENDED

# the findings that name a cause others can wait on
CAUSE_CODES = vocab.codes(cause=True)
GONE = tuple(p for p in WORKER_ENDED if p != "failed")  # a failed worker still holds its peers up
BLOCKED_MAX = 256  # names kept in an alert (a collective of 65,536 ranks has as many waiting)
# more causes than this at once (a whole cluster silent) is no cascade from one fault: nobody is marked,
# and the rule's work stays bounded (each cause looks at its groups' members)
CAUSES_MAX = 32


def held_up(state: RunState, causes: list[str]) -> list[str]:
    """The workers waiting on any of ``causes``, not counting the causes themselves."""
    out: set[str] = set()
    for src in causes:
        w = state.workers.get(src)
        if w is not None and w.role == "teacher":
            out.update(v.src for v in state.workers.values() if v.phase == "teacher_wait")
        for members in state.collectives.values():
            p = members.get(src)
            if p is None or not p.entered:
                continue
            # left None: the source cannot say what completed (gloo read from the Flight Recorder); the
            # cause is taken to be inside its last one, and a peer to wait only in one the cause never entered
            done = p.left if p.left is not None else p.entered - 1
            for peer, q in members.items():
                inside = q.left < q.entered if q.left is not None else q.entered > p.entered
                if peer != src and q.entered and inside and done < q.entered:
                    out.add(peer)
    out.difference_update(causes)
    # a victim that failed of it stays one; one that finished or left has nothing to wait for
    return sorted(s for s in out if s in state.workers and state.workers[s].phase not in GONE)


def with_blocked(state: RunState, alerts: list[AlertEvent],
                 waiting_on: Callable[[set[str]], set[str]] | None = None) -> list[AlertEvent]:
    """``alerts``, each cause's carrying the workers it holds up (beside any its rule listed itself), and each
    finding that names a worker, the workers whose waits lead to it (``waiting_on``: the wait-for graph's, at
    any distance: the queue, and the trainer at its end, behind a server whose request is stuck). Up to
    ``CAUSES_MAX`` findings: more at once (a whole cluster silent) is no cascade from one fault."""
    named = [i for i, a in enumerate(alerts) if a.targets and not a.cleared and a.severity != "info"]
    causes = [i for i in named if alerts[i].code in CAUSE_CODES]
    causes = causes if len(causes) <= CAUSES_MAX else []
    chained = named if waiting_on is not None and len(named) <= CAUSES_MAX else []
    out = list(alerts)
    for i in sorted(set(causes) | set(chained)):
        a = alerts[i]
        behind = waiting_on(set(a.targets)) if i in chained and waiting_on is not None else set()
        held = held_up(state, a.targets) if i in causes else []
        blocked = sorted((set(blocked_of(a.evidence)) | set(held) | behind) - set(a.targets))
        if not blocked:
            continue
        # a wait that holds the job's driver holds the whole job: it stalls, and that is critical
        holds_the_job = i in chained and any(b in state.workers and state.workers[b].role == "driver" for b in behind)
        out[i] = msgspec.structs.replace(a, severity="critical" if holds_the_job else a.severity,
                                         evidence={**a.evidence, "blocked": blocked[:BLOCKED_MAX]})
    return out
