"""Rules on the workers: a stale heartbeat, a straggler, one slower than its peers step after step, a dead actor,
no step for too long, the driver's failure, events dropped."""

from __future__ import annotations

from gkd_core.diagnosis.cascade import BLOCKED_MAX
from gkd_core.diagnosis.headline import headline
from gkd_core.diagnosis.marks import marked, on_node
from gkd_core.diagnosis.rules.common import FAILED_WORKER, SLOW_ON_PURPOSE, Settings, last_words, phase_hint
from gkd_core.diagnosis.rules.servers import EXTERNAL_HINT, external_request
from gkd_core.diagnosis.slow_peers import slow_workers
from gkd_core.diagnosis.stragglers import NOT_WORK, Late, late_workers, set_up
from gkd_core.diagnosis.verdict import verdict
from gkd_core.node.cpu_load import NODE_BUSY
from gkd_core.state import RunState, WorkerState
from gkd_core.state.beat_table import silent_workers
from gkd_core.state.liveness import ALIVE, FROZEN, LATE, Limits, judge, others_heard
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import precise, spoken
from gkd_core.vocab import WORKER_ENDED


def heartbeat_stale(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A worker that sends no heartbeat: frozen or dead (``liveness.judge``: at ``stall_s``, or at
    ``frozen_s`` while others are heard from). That is critical at once, unless its node's CPU is held outside
    the run (a starved thread: critical at ``stall_s``) or it is in a phase slow on purpose (a checkpoint's
    pickling can hold the GIL). A worker in a set-up phase is critical only past its set-up deadline
    (``_silent_in_set_up``). Silence counts from when the process was last heard from (``heard_from``)."""
    limits = cfg.limits
    others = others_heard(state, now, limits)
    judged = silent_workers(state, now, limits)  # late or frozen (from the beat table: no walk)
    silent = {w.src: j.silent_s or 0.0 for w, j in judged if j.word == FROZEN}
    # A relay (a node agent) that falls silent takes its workers' events with it: they are said with
    # it, once, not as as many frozen workers. Its workers' beats reach it up to two periods before
    # its own go quiet, so a relay that is nearly stale counts too.
    quiet_relays = {w.src for w, _ in judged if w.role == "agent"}
    behind: dict[str, list[str]] = {}
    for src in silent:
        w = state.workers[src]
        if w.via in quiet_relays:
            behind.setdefault(w.via, []).append(w.src)
    out = []
    for src, age in silent.items():
        w = state.workers[src]
        if w.via in quiet_relays:
            continue
        where = f"pid {w.pid} on {w.node}" if w.pid else "no pid registered"
        busy = node_busy(state, w)
        relayed = len(behind.get(w.src, ()))
        if set_up(w.phase) and not relayed:
            out.append(_silent_in_set_up(w, age, now, where, busy, cfg))
            continue
        v = verdict(state, w, now, limits)
        with_it = (f"; the {relayed} worker(s) whose events it relays are silent with it (they may be working: "
                   "their events wait in their own queues)") if relayed else ""
        out.append(AlertEvent(
            severity="critical" if age > cfg.stall_s or relayed or (others and not busy
                                                                    and w.phase not in SLOW_ON_PURPOSE) else "warn",
            code="heartbeat_stale",
            message=f"{w.src} sent no heartbeat for {spoken(age)} "
                    f"{'while others did' if others else 'nor did any other process'} (phase {w.phase}, "
                    f"{where}){'; ' + v.text if v.where or v.word == 'dead' else ''}{with_it}"
                    + (f"; {busy}" if busy else ""),
            hint=f"the process is frozen (SIGSTOP, D state, the GIL held in C) or dead: press d on it, or "
                 f"`gkd-tui dump-stacks {w.src}`" + ("; the driver starts a dead node agent again between steps"
                                                     if relayed else ""),
            targets=[w.src], evidence={"heartbeat_age_s": round(age, 1), "phase": w.phase, "elapsed_s": round(age, 1),
                                       "verdict": v.word or "frozen", "where": v.where, "relayed_silent": relayed,
                                       "node_busy": bool(busy),
                                       **({"blocked": sorted(behind[w.src])[:BLOCKED_MAX]} if relayed else {})},
        ))
    return out


def _silent_in_set_up(w: WorkerState, age: float, now: float, where: str, busy: str, cfg: Settings) -> AlertEvent:
    """A starting process is judged against its set-up deadline (the phase's own, else ``setup_s`` from its
    start), not the heartbeat's: an import or a model load can hold the GIL in C for seconds, a busy node
    starves it. Said (warn) as any silence is, critical only past the deadline. A process that died while
    starting is named at once by the driver, whose wait for it ends with its death (``driver_failed``)."""
    deadline = w.deadline or w.phase_since + cfg.setup_s
    past = now > deadline
    said = (f"{w.src} sent no heartbeat for {spoken(age)} in its set-up (phase {w.phase} for "
            f"{spoken(now - w.phase_since)}, {where})")
    if past:
        said += f", past its set-up deadline ({spoken(deadline - w.phase_since)} from the phase's start)"
    else:
        said += (f"; its set-up deadline is in {spoken(deadline - now)}: a starting process can hold the GIL in an "
                 "import or a model load for a while")
    return AlertEvent(
        severity="critical" if past else "warn", code="heartbeat_stale", message=said + (f"; {busy}" if busy else ""),
        hint=phase_hint(w.phase) if past else (
            "nothing to do yet: it is starting" + (" on a busy node" if busy else "") + "; its stack (d) says where"),
        targets=[w.src],
        evidence={"heartbeat_age_s": round(age, 1), "phase": w.phase, "elapsed_s": round(age, 1),
                  "verdict": "frozen" if past else ("starved" if busy else "starting"), "where": "",
                  "relayed_silent": 0, "node_busy": bool(busy), "set_up_deadline_in_s": round(deadline - now, 1)},
    )


def node_busy(state: RunState, w: WorkerState) -> str:
    """What the agent of ``w``'s node says of its CPU when it is held by processes outside the run, else ""."""
    if w.via:
        agent = state.workers.get(w.via)
    else:  # (a worker that reports straight to the supervisor: its node's agent, if the node has one)
        agent = next((a for a in on_node(state, w.node) if a.role == "agent"), None) if w.node else None
    return agent.detail if agent is not None and agent.phase == NODE_BUSY and agent is not w else ""


def stragglers(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Late workers, named by their peers (or by their own history), with the stuck-or-slow verdict."""
    if state.state not in ("running", ""):
        return []
    return [_late_alert(state, late, now, cfg.limits) for late in late_workers(state, now)]


def slower_than_peers(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A worker slower than its peers step after step (``slow_peers``): warned, since the run goes on at its pace."""
    if state.state not in ("running", ""):
        return []
    out = []
    for s in slow_workers(state):
        w = state.workers.get(s.src)
        if w is None or w.phase in WORKER_ENDED:
            continue
        where = f" [pid {w.pid} on {w.node}]" if w.pid and w.node else ""
        out.append(AlertEvent(
            severity="warn", code="slower_than_peers", targets=[s.src],
            message=f"{s.src} is {s.took / s.peers:.1f}x slower than its peers in {s.phase}: {precise(s.took)} against "
                    f"their {precise(s.peers)} (medians), in {s.slow_in} of its last {s.of} steps; every step waits "
                    f"for it{where}",
            hint="a slower device or node (a throttled or degraded GPU, a node shared with another job, a slower "
                 "link): its node's GPUs and CPU, and its stack (d); if it stays, move it off that node or restart "
                 "without it (r)",
            evidence={"phase": s.phase, "ratio": round(s.took / s.peers, 2), "took_s": round(s.took, 4),
                      "peers_s": round(s.peers, 4), "slow_in": s.slow_in, "of": s.of}))
    return out


def _late_alert(state: RunState, late: Late, now: float, limits: Limits) -> AlertEvent:
    w = state.workers[late.src]
    v = verdict(state, w, now, limits)
    at = f" (step {late.step})" if late.step is not None else ""
    if late.by == "peers":
        code = "straggler"
        peers = "its peer" if late.n_done == 1 else f"{late.n_done} of its {late.n_group} peers"
        base = f"{peers} finished in {precise(late.baseline)}" + (" (median)" if late.n_done > 1 else "")
    else:
        code = "slower_than_usual"
        base = f"usually {precise(late.baseline)} (median of its last {late.n_done})"
    where = f"pid {w.pid} on {w.node}" if w.pid else (w.node or "")
    if w.in_flight > 1 and w.phase == late.phase:  # an async server's: measured by its oldest call
        at += f" (the oldest of {w.in_flight} in flight)"
    # a request to a server outside the run that has not answered: the cause, said with its address and process
    external = external_request(state, w) if w.waits_on and w.phase == late.phase else None
    message = (f"{late.src} still in {late.phase}{at} after {spoken(late.elapsed)}; {base}"
               + (f"; waiting for {w.detail.partition('waiting for ')[2] or external.spoken()}"
                  if external is not None else "")
               + (f"; {v.text}" if v.text else "") + (f" [{where}]" if where else "")
               + _before_the_teacher(state, late, w.phase_since))
    return AlertEvent(
        severity=late.severity, code=code, message=message, targets=[late.src],
        hint=EXTERNAL_HINT if external is not None else phase_hint(late.phase),
        evidence={"phase": late.phase, "step": late.step, "elapsed_s": round(late.elapsed, 1),
                  "threshold_s": round(late.threshold, 2), "baseline_s": round(late.baseline, 3), "by": late.by,
                  "peers_done": late.n_done, "peers": late.n_group, "cpu_pct": w.cpu, "verdict": v.word,
                  "where": v.where, "in_flight": w.in_flight,
                  **({"external": external.route()} if external is not None else {})},
    )


def _before_the_teacher(state: RunState, late: Late, since: float) -> str:
    """The finding of the verl GKD write-up: the teacher server "received no requests" because the
    rollouts never got past generation. Said when a generation is late and nothing was sent since."""
    clients = [c for k, c in state.teacher.by_src.items() if k.startswith("client:")]
    if "generate" not in late.phase or not clients or any(c.sent_at >= since for c in clients):
        return ""
    return "; the teacher has received no request since: the hang is before the teacher, not in it"


def actor_dead(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    if state.state != "running":
        return []
    out = []
    for w in marked(state, "dead_actor"):
        # killed on purpose (the driver starting a teacher again, a forced cancel: on the record as actions)
        if w.phase in WORKER_ENDED or "killed by `ray.kill`" in w.ray_death_cause:
            continue
        words = last_words(state, w.src)
        out.append(AlertEvent(
            severity="critical", code="actor_dead",
            message=f"Ray reports {w.src}'s actor DEAD (pid {w.pid or '?'} on {w.node or '?'})"
                    + (f": {w.ray_death_cause[:160]}" if w.ray_death_cause else "") + (f"; {words}" if words else ""),
            hint="out of memory or killed? read its log (enter on it); restart (r) resumes from the latest checkpoint",
            targets=[w.src]))
    return out


NO_STEP_FACTOR = 3.0


NO_STEP_MIN_S = 30.0


def no_progress(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 001's "the log stopped for 2 minutes": every process alive (heartbeats flow) but no step
    for 3x the median step time."""
    ms = state.metrics[-33:]
    if state.state != "running" or len(ms) < 4:
        return []
    gaps = sorted(b.ts - a.ts for a, b in zip(ms, ms[1:], strict=False))
    median = gaps[len(gaps) // 2]
    limit = max(NO_STEP_MIN_S, NO_STEP_FACTOR * median)
    if now - max(ms[-1].ts, state.running_since) < limit:
        return []  # (the driver's set-up below only shortens it)
    driver = state.workers.get("driver")
    if driver is not None and (set_up(driver.phase) or driver.phase in SLOW_ON_PURPOSE):
        return []
    # a restarted driver's set-up is not a stall: counted from its end (the moment between two of its
    # set-up phases included), not from the restart
    set_up_ended = max((s.ended for s in driver.spans if set_up(s.phase) or s.phase in SLOW_ON_PURPOSE),
                       default=0.0) if driver is not None else 0.0
    since = now - max(ms[-1].ts, state.running_since, set_up_ended)
    if since < limit:
        return []
    alive = [w for w in state.workers.values() if judge(state, w, now, cfg.limits).word in (ALIVE, LATE)]
    if not alive or late_workers(state, now):  # a named straggler is the why already
        return []
    busy = sorted(((now - w.phase_since, w.src, w.phase) for w in alive if w.phase not in NOT_WORK),
                  reverse=True)[:3]
    return [AlertEvent(
        severity="warn", code="no_progress",
        message=f"no training step for {spoken(since)} ({since / max(median, 1e-3):.0f}x the median step of "
                f"{precise(median)}), every heartbeat fresh; longest in a phase: "
                + (", ".join(f"{src} in {ph} {spoken(t)}" for t, src, ph in busy) or "nobody"),
        hint="alive but not progressing: dump every stack (D) and look for the odd one out",
        targets=[busy[0][1]] if busy else [],
        evidence={"since_s": round(since, 1), "median_step_s": round(median, 3), "elapsed_s": round(since, 1)},
    )]


def driver_failed(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    if state.state != "failed":
        return []
    line = headline(state.log_tail)
    m = FAILED_WORKER.search(line.removeprefix("gkd driver: "))
    words = last_words(state, m.group(1))[:150] if m and "died" in line else ""
    return [AlertEvent(
        severity="critical", code="driver_failed",
        message=f"driver {state.reason}: {line}"[:300 - len(words) - 4] + (f" ({words})" if words else ""),
        hint="read RUN/logs/driver.log; `gkd-tui restart` resumes from the latest checkpoint",
        # the worker whose failure ended it, else the driver itself
        targets=[m.group(1)] if m else ["driver"], evidence={"verdict": "dead"} if m and "died" in line else {},
    )]


def events_dropped(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    dropped = {w.src: w.dropped for w in marked(state, "dropping")}
    if not dropped:
        return []
    return [AlertEvent(
        severity="info", code="events_dropped",
        message=f"{sum(dropped.values())} events dropped by {len(dropped)} sender(s) (queue full or supervisor away)",
        hint="the senders are too chatty or the supervisor too slow; counts only, the run goes on",
    )]
