"""The teacher rule: requests owed and not answered, and which side holds them; a worker that answers errors."""

from __future__ import annotations

from gkd_core.diagnosis.rules.common import Settings
from gkd_core.diagnosis.verdict import verdict
from gkd_core.state import RunState, TeacherSide
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken
from gkd_core.vocab import WORKER_ENDED

TEACHER_STALL_S = 5.0  # requests owed with no answer for this long: say which side holds them
TEACHER_STALL_FACTOR = 5.0  # ... or this many times the side's own p95 latency, when that is longer
ERRORS_NAMED = 3  # answers in a row that were errors: a worker that fails every request, not one bad request
ERRORS_FRESH_S = 10.0  # ... the last of them this recent: a streak that stopped (no request since, or its death)


def _stall_limit(side) -> float:
    return max(TEACHER_STALL_S, TEACHER_STALL_FACTOR * side.latency_ms.get("p95", 0.0) / 1000)


def teacher(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 000's question, "the teacher server received no requests": which side holds them. The
    client sent but the server received none (the path between them); the server received but its
    workers serve none while its queue grows (the teacher workers); they serve, but every answer of one of
    them is an error (that worker)."""
    if state.state not in ("running", ""):
        return []
    # what a side said before the driver was (re)started is of the driver that is gone and of its teacher:
    # the requests its client had in flight died with it (a restart is no teacher that went unreached)
    sides = {k: s for k, s in state.teacher.by_src.items() if s.ts >= state.running_since}
    clients = [(k.partition(":")[2], s) for k, s in sides.items() if k.startswith("client:") and s.in_flight]
    servers = [s for k, s in sides.items() if k.startswith("server:")]
    out = []
    for src, c in clients:
        waited = now - max(c.progress_at, state.running_since)
        if waited < _stall_limit(c):
            continue
        if not servers and src in state.workers and state.workers[src].role != "driver":
            out.append(_owed(src, c, waited))  # a framework's teacher client (verl's): its servers are not ours
            continue
        # the newest sends never arrived: fewer received than sent, nothing received since, and no server says it
        # holds requests it received (counts compared across a restarted proxy can differ while they did arrive)
        sent = sum(x.sent for k, x in sides.items() if k.startswith("client:"))
        held = any(s.queue_depth and now - s.ts <= cfg.limits.fresh_s for s in servers)
        if not servers or (sum(s.received for s in servers) < sent and not held
                           and all(s.received_at < c.sent_at for s in servers)):
            got = sum(s.received for s in servers)
            out.append(AlertEvent(
                severity="critical", code="teacher_unreached", targets=["teacher/proxy"],
                message=f"the teacher client has {c.in_flight} request(s) in flight for {spoken(waited)} (sent "
                        f"{c.sent}); the teacher server received none of them (received {got} in all)",
                hint="the path between them: teacher.address, the proxy's host and port, a firewall; "
                     "`gkd-tui doctor` checks what it can",
                evidence={"sent": c.sent, "in_flight": c.in_flight, "received": got, "elapsed_s": round(waited, 1)}))
    fresh = cfg.limits.fresh_s
    for s in servers:
        if now - s.ts <= fresh:
            out += _erring(state, s, now)
    for s in servers:
        waited = now - s.progress_at
        # counts the proxy has not said again lately are not the queue now: the proxy (or the relay that
        # carries its events) is silent, which heartbeat_stale names; its workers are not to blame
        if s.queue_depth and waited >= _stall_limit(s) and now - s.ts <= fresh:
            workers = sorted(w.src for w in state.workers.values() if w.role == "teacher" and w.src != "teacher/proxy"
                             and w.phase not in WORKER_ENDED)
            vs = {w: verdict(state, state.workers[w], now, cfg.limits) for w in workers[:4]}
            verdicts = [f"{w}: {v.text}" for w, v in vs.items()]
            out.append(AlertEvent(
                severity="critical", code="teacher_not_serving", targets=workers or ["teacher/proxy"],
                message=f"the teacher server received {s.received}, served {s.served}, {s.queue_depth} waiting for "
                        f"{spoken(waited)}: its workers do not answer"
                        + (f" ({'; '.join(verdicts)})" if verdicts else ""),
                hint="the teacher workers: their stacks (d), out of memory or dead (see the workers table); "
                     "restart (r) brings them back",
                evidence={"received": s.received, "served": s.served, "queue_depth": s.queue_depth,
                          "elapsed_s": round(waited, 1), "verdict": ",".join(v.word for v in vs.values()),
                          "where": ";".join(v.where for v in vs.values())}))
    return out


def _erring(state: RunState, s: TeacherSide, now: float) -> list[AlertEvent]:
    """The teacher workers whose every answer lately was an error: named, with the error the client got (the
    driver's phase says it while it retries the step's scoring)."""
    out = []
    for worker, (since, count, last) in sorted(s.error_streaks.items()):
        if count < ERRORS_NAMED or now - last > ERRORS_FRESH_S:
            continue  # one bad request; or errors that stopped coming (its death, or no request since, is another's)
        driver = state.workers.get("driver")
        said = driver.detail if driver is not None and "the teacher answered" in driver.detail else ""
        out.append(AlertEvent(
            severity="critical", code="teacher_errors", targets=[worker],
            message=f"{worker} answers every request with an error: its last {count}, for {spoken(now - since)}"
                    + (f"; the driver: {said[:240]}" if said else ""),
            hint="the teacher worker fails every request: its error is in the log (l) and its stack (d); a bad "
                 "model folder, a full GPU or a broken engine; restart (r) starts it again",
            evidence={"errors": count, "errors_all": s.errors.get(worker, 0), "since": round(since, 3)}))
    return out


def _owed(src: str, c: TeacherSide, waited: float) -> AlertEvent:
    """A teacher client of a job that is not ours (verl's teacher loop, in its agent-loop workers): its
    requests owed, and no server of ours to ask whether they arrived. Named on the client, the servers'
    stacks being where to look."""
    return AlertEvent(
        severity="warn", code="teacher_owed", targets=[src],
        message=f"{src}: {c.in_flight} teacher request(s) in flight for {spoken(waited)}, none answered since (sent "
                f"{c.sent}, done {c.completed}); its teacher servers report no counts to the run",
        hint="the teacher servers: their stacks (D) say whether they hold the requests (a server's calls in flight "
             "in the workers table), or the path to them",
        evidence={"sent": c.sent, "in_flight": c.in_flight, "completed": c.completed, "elapsed_s": round(waited, 1)})
