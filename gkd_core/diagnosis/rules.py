"""The rules: each a small pure function of the RunState and ``now`` that returns the alerts that
hold now, with its evidence and its hint in one place.

The hints are the fixes that the hang write-ups this project grew from give for each case (verl's
recipe/gkd hangs, a hang flow chart, a Ray self-play guide, LightRFT's troubleshooting guide),
said as what to do, not where it was read.
"""

from __future__ import annotations

import re
from typing import Callable, NamedTuple

from gkd_core import vocab
from gkd_core.diagnosis.cascade import BLOCKED_MAX
from gkd_core.diagnosis.headline import headline
from gkd_core.diagnosis.stragglers import MIN_S, Late, late_workers
from gkd_core.diagnosis.verdict import FROZEN_S, verdict
from gkd_core.state import OOM, TERMINAL_PHASES, RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import precise, spoken


class Settings(NamedTuple):
    stall_s: float = 10.0  # a heartbeat older than this is stale
    heartbeat_s: float = 1.0  # how often workers send one: a silence is judged against it


BAD_STEP_SHOWN = 50  # steps a skipped step stays on the dashboard after it
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


def frozen_limits(cfg: Settings) -> tuple[float, float]:
    """(a heartbeat this young is fresh, a silence this long is frozen): three beats, at least 5 s."""
    return max(3.0, 3 * cfg.heartbeat_s), max(FROZEN_S, 3 * cfg.heartbeat_s)


def heartbeat_stale(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A worker that sends no heartbeat: frozen or dead. Named at ``stall_s``, or sooner (FROZEN_S)
    when its peers' heartbeats still arrive: then it is this process, not the path or the supervisor."""
    fresh, frozen = frozen_limits(cfg)
    others_fresh = sum(1 for w in state.workers.values() if w.last_heartbeat and now - w.last_heartbeat < fresh)
    limit = min(cfg.stall_s, frozen) if others_fresh else cfg.stall_s
    stale = state.stale_workers(now, limit)
    # A relay (a node agent) that falls silent takes its workers' events with it: they are said with
    # it, once, not as as many frozen workers. Its workers' beats reach it up to two periods before
    # its own go quiet, so a relay that is nearly stale counts too.
    quiet_relays = {w.src for w in state.workers.values() if w.role == "agent" and w.last_heartbeat
                    and now - w.last_heartbeat > limit - 2 * cfg.heartbeat_s and w.phase not in TERMINAL_PHASES}
    behind: dict[str, list[str]] = {}
    for w in stale:
        if w.via in quiet_relays:
            behind.setdefault(w.via, []).append(w.src)
    out = []
    for w in stale:
        if w.via in quiet_relays:
            continue
        age = now - w.last_heartbeat
        where = f"pid {w.pid} on {w.node}" if w.pid else "no pid registered"
        v = verdict(state, w, now, frozen)
        relayed = len(behind.get(w.src, ()))
        with_it = (f"; the {relayed} worker(s) whose events it relays are silent with it (they may be working: "
                   "their events wait in their own queues)") if relayed else ""
        out.append(AlertEvent(
            severity="critical" if w.phase == "sync_weights" or age > cfg.stall_s or relayed else "warn",
            code="heartbeat_stale",
            message=f"{w.src} sent no heartbeat for {spoken(age)} while {others_fresh} other(s) did (phase {w.phase}, "
                    f"{where}){'; ' + v.text if v.where or v.word == 'dead' else ''}{with_it}",
            hint=f"the process is frozen (SIGSTOP, D state, the GIL held in C) or dead: press d on it, or "
                 f"`gkd-tui dump-stacks {w.src}`" + ("; the driver starts a dead node agent again between steps"
                                                     if relayed else ""),
            targets=[w.src], evidence={"heartbeat_age_s": round(age, 1), "phase": w.phase, "elapsed_s": round(age, 1),
                                       "verdict": v.word or "frozen", "where": v.where, "relayed_silent": relayed,
                                       **({"blocked": sorted(behind[w.src])[:BLOCKED_MAX]} if relayed else {})},
        ))
    return out


def stragglers(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Late workers, named by their peers (or by their own history), with the stuck-or-slow verdict."""
    if state.state not in ("running", ""):
        return []
    return [_late_alert(state, late, now, frozen_limits(cfg)[1]) for late in late_workers(state, now)]


def _late_alert(state: RunState, late: Late, now: float, frozen_s: float) -> AlertEvent:
    w = state.workers[late.src]
    v = verdict(state, w, now, frozen_s)
    at = f" (step {late.step})" if late.step is not None else ""
    if late.by == "peers":
        code = "straggler"
        peers = "its peer" if late.n_done == 1 else f"{late.n_done} of its {late.n_group} peers"
        base = f"{peers} finished in {precise(late.baseline)}" + (" (median)" if late.n_done > 1 else "")
    else:
        code = "slower_than_usual"
        base = f"usually {precise(late.baseline)} (median of its last {late.n_done})"
    where = f"pid {w.pid} on {w.node}" if w.pid else (w.node or "")
    message = (f"{late.src} still in {late.phase}{at} after {spoken(late.elapsed)}; {base}"
               + (f"; {v.text}" if v.text else "") + (f" [{where}]" if where else "")
               + _before_the_teacher(state, late, w.phase_since))
    return AlertEvent(
        severity=late.severity, code=code, message=message, targets=[late.src],
        hint=phase_hint(late.phase),
        evidence={"phase": late.phase, "step": late.step, "elapsed_s": round(late.elapsed, 1),
                  "threshold_s": round(late.threshold, 2), "baseline_s": round(late.baseline, 3), "by": late.by,
                  "peers_done": late.n_done, "peers": late.n_group, "cpu_pct": w.cpu, "verdict": v.word,
                  "where": v.where},
    )


def _before_the_teacher(state: RunState, late: Late, since: float) -> str:
    """The finding of the verl GKD write-up: the teacher server "received no requests" because the
    rollouts never got past generation. Said when a generation is late and nothing was sent since."""
    clients = [c for k, c in state.teacher.by_src.items() if k.startswith("client:")]
    if "generate" not in late.phase or not clients or any(c.sent_at >= since for c in clients):
        return ""
    return "; the teacher has received no request since: the hang is before the teacher, not in it"


def sync(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    out: list[AlertEvent] = []
    view = state.sync_view(now)
    s = state.sync
    if view is None or s is None:
        return out
    pend = ", ".join(view.pending[:6]) + (" …" if len(view.pending) > 6 else "")
    if view.running and view.timeout_s and view.fraction >= 0.5:
        out.append(AlertEvent(
            severity="warn", code="sync_slow",
            message=f"sync {view.sync_id} at {spoken(view.elapsed_s)} of its {spoken(view.timeout_s)} timeout; "
                    f"waiting for {pend or 'nobody?'}",
            hint="dump the stragglers' stacks (d); a NCCL broadcast with no progress means a peer is gone",
            targets=list(view.pending), evidence={"elapsed_s": round(view.elapsed_s, 1), "timeout_s": view.timeout_s},
        ))
    elif s.state == "timed_out":
        out.append(AlertEvent(
            severity="critical", code="sync_timed_out",
            message=f"sync {s.sync_id} timed out after {spoken(s.elapsed_s)}; pending: {pend}",
            hint="dump their stacks (d), then cancel the sync (c) or restart smaller (r)",
            targets=list(s.pending),
        ))
    elif s.state == "failed":
        out.append(AlertEvent(
            severity="critical", code="sync_failed", message=f"sync {s.sync_id} failed: {s.error[:200]}",
            hint="see the worker's log; restart (r) resumes from the latest checkpoint", targets=list(s.pending),
        ))
    return out + fingerprint_mismatch(state, now)


MISMATCH_HOLD_S = 60.0


def fingerprint_mismatch(state: RunState, now: float) -> list[AlertEvent]:
    """A rollout whose weights were not the student's after a sync: critical while the newest sync says
    so, and for MISMATCH_HOLD_S after a later sync matched (a step generated on stale weights is worth
    seeing, and the next sync may follow within a second, before any look at the state)."""
    m = state.fingerprint_miss
    if m is None:
        return []
    s = state.sync
    righted = s is not None and s.sync_id > m.sync_id and s.fingerprint_ok is True
    if righted and now - m.last_ts > MISMATCH_HOLD_S:
        return []
    who = ", ".join(m.differ) or "a rollout worker"
    return [AlertEvent(
        severity="warn" if righted else "critical", code="fingerprint_mismatch",
        message=f"after sync {m.sync_id} (step {m.step}) {who}: its weights differ from the student's"
                + (" (the syncs since matched)" if righted else "") + (f"; {m.error[:200]}" if m.error else ""),
        hint="its engine generated with stale weights: a weight push that did not land in it; if it "
             "stays, restart (r), which loads the latest checkpoint into every engine",
        targets=list(m.differ))]


def collectives(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Collective #N of a process group: the ranks that have not entered it while their peers wait in
    it; or, all in, the ranks that have not left it. Proof at the level of the collective, where the
    straggler rule infers from phases and times."""
    if state.state not in ("running", ""):
        return []
    out = []
    fresh = frozen_limits(cfg)[0]
    for group, members in state.collectives.items():
        n = max((p.entered for p in members.values()), default=0)
        if n == 0 or len(members) < 2:
            continue
        inside = {src: p for src, p in members.items() if p.entered == n}
        # a rank whose source cannot say it left (gloo read from the Flight Recorder) counts as waiting
        waiting = sorted(src for src, p in inside.items() if p.left is None or p.left < n)
        waited = now - min(p.entered_at for p in inside.values())
        if not waiting or waited < MIN_S:
            continue
        op = next((p.op for p in inside.values() if p.op), "collective")
        world = max(p.world for p in members.values())
        missing = sorted(src for src, p in members.items() if p.entered < n)
        unseen = world - len(members)  # ranks that never reported: not watched, or not started
        what = f"{op} #{n} of group {group}"
        severity = "critical" if waited >= 2 * MIN_S else "warn"
        evidence = {"group": group, "seq": n, "op": op, "elapsed_s": round(waited, 1), "in": sorted(inside),
                    "world": world}
        if missing:
            doing = "; ".join(f"{m} is in {state.workers[m].phase or '?'}" for m in missing[:4] if m in state.workers)
            out.append(AlertEvent(
                severity=severity, code="collective_not_joined", targets=missing,
                message=f"{', '.join(missing[:6])}{' …' if len(missing) > 6 else ''} has not joined {what}; "
                        f"{len(inside)} peer(s) waiting for {spoken(waited)}" + (f" ({doing})" if doing else "")
                        + (f"; {unseen} rank(s) never reported" if unseen > 0 else ""),
                hint="its stack (d) says what it does instead: a rank that skipped or reordered a collective, "
                     "an exception swallowed before it, or a hang earlier in its step; cancel (c) or restart (r)",
                evidence={**evidence, "missing": missing}))
        elif unseen <= 0 and all(members[w].left is not None for w in waiting):
            silent = [w for w in waiting if w in state.workers and state.workers[w].last_heartbeat
                      and now - state.workers[w].last_heartbeat > fresh]
            out.append(AlertEvent(
                severity=severity, code="collective_stuck", targets=silent or waiting,
                message=f"all {len(members)} ranks joined {what}; {', '.join(waiting[:6])} inside it for "
                        f"{spoken(waited)}" + (f"; {', '.join(silent)} sends no heartbeat (frozen inside it)"
                                               if silent else "; stuck in the transport"),
                hint=("the frozen rank's stack (d); it holds its peers in the collective" if silent else
                      f"every rank is in and none comes out: the transport (network, firewall, {NCCL_TRY})"),
                evidence={**evidence, "inside": waiting, "frozen": silent}))
    return out


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


def actor_dead(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    if state.state != "running":
        return []
    out = []
    for w in state.workers.values():
        # killed on purpose (the driver starting a teacher again, a forced cancel: on the record as actions)
        if w.ray_state != "DEAD" or w.phase in TERMINAL_PHASES or "killed by `ray.kill`" in w.ray_death_cause:
            continue
        words = last_words(state, w.src)
        out.append(AlertEvent(
            severity="critical", code="actor_dead",
            message=f"Ray reports {w.src}'s actor DEAD (pid {w.pid or '?'} on {w.node or '?'})"
                    + (f": {w.ray_death_cause[:160]}" if w.ray_death_cause else "") + (f"; {words}" if words else ""),
            hint="out of memory or killed? read its log (enter on it); restart (r) resumes from the latest checkpoint",
            targets=[w.src]))
    return out


def gpu_probe_hung(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    out = []
    for node, probe, seconds in state.hung_probes(now):
        name = "NVML" if probe == "nvml" else probe
        out.append(AlertEvent(
            severity="critical", code="gpu_probe_hung",
            message=f"{name} on {node} has not answered for {spoken(seconds)}",
            hint="the GPU driver is wedged (nvidia-smi would freeze too): check `dmesg` for Xid errors; "
                 "a worker stuck in CUDA will not come back, restart (r) on healthy nodes",
            targets=[f"agent/{node}"] if probe == "nvml" else [f"agent/{node}", probe],
            evidence={"probe": probe, "seconds": round(seconds, 1)},
        ))
    return out


GPU_IDLE_FULL_S = 60.0  # memory full, nothing computed, for this long
GPU_SPREAD = 50.0  # utilisation points between the busiest and the idlest GPU of the run
GPU_FRESH_S = 30.0  # readings older than this are not compared


def gpu_danger(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """The danger signs of a GPU run: a GPU full of memory at 0 % utilisation for a minute (a process
    that holds it and waits: a hung collective, a leftover process), and GPUs badly unbalanced."""
    if state.state not in ("running", ""):
        return []
    out = []
    by_pid = {w.pid: w.src for w in state.workers.values() if w.pid}
    rows = [g for g in state.gpu_rows() if now - g.ts < GPU_FRESH_S]
    for g in rows:
        if g.full_idle_since is not None and now - g.full_idle_since >= GPU_IDLE_FULL_S:
            holders = [by_pid.get(p, f"pid {p}") for p in g.pids]
            out.append(AlertEvent(
                severity="warn", code="gpu_idle_full", targets=[f"gpu {g.node}/{g.index}", *holders],
                message=f"GPU {g.index} on {g.node}: {100 * (g.mem_used or 0) / (g.mem_total or 1):.0f} % of its memory "
                        f"used at 0 % utilisation for {spoken(now - g.full_idle_since)}"
                        + (f" (held by {', '.join(holders)})" if holders else ""),
                hint="a process holds the GPU and computes nothing: a hung collective or a leftover process; its "
                     "stack (d); `nvidia-smi` lists the pids",
                evidence={"elapsed_s": round(now - g.full_idle_since, 1), "util": g.util, "mem_used": g.mem_used,
                          "mem_total": g.mem_total}))
    smooth = [(g.util_avg, g) for g in rows if g.util_avg is not None]
    if len(smooth) >= 2 and state.running_since and now - state.running_since > GPU_IDLE_FULL_S:
        (lo, g_lo), (hi, g_hi) = min(smooth, key=lambda x: x[0]), max(smooth, key=lambda x: x[0])
        if hi - lo >= GPU_SPREAD:
            idle = [f"gpu {g.node}/{g.index}" for u, g in smooth if hi - u >= GPU_SPREAD]
            out.append(AlertEvent(
                severity="warn", code="gpu_unbalanced", targets=idle,
                message=f"GPUs unbalanced: {g_hi.node}/{g_hi.index} at {hi:.0f} %, {g_lo.node}/{g_lo.index} at "
                        f"{lo:.0f} % (averaged over the last minute); {len(idle)} of {len(smooth)} far below the "
                        "busiest",
                hint="an uneven split of the work (batch sizes not divisible by the workers) or a straggler on the "
                     "idle ones; compare their phases in the workers table",
                evidence={"max_util": round(hi, 1), "min_util": round(lo, 1)}))
    return out


def bad_step(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 004's NaN loss: a step skipped because its loss or gradient norm was not finite."""
    if not state.bad_steps or state.step is None or state.step - state.bad_steps[-1] >= BAD_STEP_SHOWN:
        return []
    last, n = state.bad_steps[-1], len(state.bad_steps)
    return [AlertEvent(
        severity="warn", code="bad_step", targets=["student/0"],
        message=f"step {last} skipped: its loss or gradient norm was not finite ({n} skipped so far); the "
                "weights, the rollouts and the checkpoints kept the last good values",
        hint="for a NaN loss: lower actor.lr, keep clipping on (actor.max_grad_norm 1.0), bfloat16 rather than "
             "float16 (model.dtype)",
        evidence={"step": last, "bad_steps": n},
    )]


MEMORY_LADDER = ("the memory ladder, in order: halve actor.micro_batch_size; gradient checkpointing; "
                 "rollout.gpu_memory_utilization 0.5 (0.4 on small GPUs); shorter sequences "
                 "(rollout.max_new_tokens); restart smaller (r) applies them in that order")
# how the driver names a worker that failed or died under a guarded wait
FAILED_WORKER = re.compile(r"^(\S+/\S+) \(.*?\) (?:failed in|died or was cancelled during) (\S+?):")


def out_of_memory(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """An out-of-memory error in a worker's log or in Ray's death cause of its actor (this driver's
    workers only: a restart starts afresh)."""
    hits = list(state.oom) + [(w.last_seen, w.src, w.ray_death_cause) for w in state.workers.values()
                              if w.ray_death_cause and OOM.search(w.ray_death_cause)
                              and w.phase not in TERMINAL_PHASES]
    if not hits:
        return []
    ts, src, line = max(hits)
    m = FAILED_WORKER.search(line.removeprefix("gkd driver: "))
    target, where = (m.group(1), f" in {m.group(2)}") if m else (src, "")
    return [AlertEvent(
        severity="critical", code="out_of_memory", targets=[target],
        message=f"{target} ran out of memory{where}: {line[:220]}",
        hint=MEMORY_LADDER, evidence={"worker": target, "line": line[:300], "ts": ts},
    )]


TEACHER_STALL_S = 5.0  # requests owed with no answer for this long: say which side holds them
TEACHER_STALL_FACTOR = 5.0  # ... or this many times the side's own p95 latency, when that is longer


def _stall_limit(side) -> float:
    return max(TEACHER_STALL_S, TEACHER_STALL_FACTOR * side.latency_ms.get("p95", 0.0) / 1000)


def teacher(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 000's question, "the teacher server received no requests": which side holds them. The
    client sent but the server received none (the path between them); the server received but its
    workers serve none while its queue grows (the teacher workers)."""
    if state.state not in ("running", ""):
        return []
    sides = state.teacher.by_src
    clients = [s for k, s in sides.items() if k.startswith("client:") and s.in_flight]
    servers = [s for k, s in sides.items() if k.startswith("server:")]
    out = []
    for c in clients:
        waited = now - c.progress_at
        if waited < _stall_limit(c):
            continue
        # the newest sends never arrived: fewer received than sent, and nothing received since
        sent = sum(x.sent for k, x in sides.items() if k.startswith("client:"))
        if not servers or (sum(s.received for s in servers) < sent
                           and all(s.received_at < c.sent_at for s in servers)):
            got = sum(s.received for s in servers)
            out.append(AlertEvent(
                severity="critical", code="teacher_unreached", targets=["teacher/proxy"],
                message=f"the teacher client has {c.in_flight} request(s) in flight for {spoken(waited)} (sent "
                        f"{c.sent}); the teacher server received none of them (received {got} in all)",
                hint="the path between them: teacher.address, the proxy's host and port, a firewall; "
                     "`gkd-tui doctor` checks what it can",
                evidence={"sent": c.sent, "in_flight": c.in_flight, "received": got, "elapsed_s": round(waited, 1)}))
    fresh = frozen_limits(cfg)[0]
    for s in servers:
        waited = now - s.progress_at
        # counts the proxy has not said again lately are not the queue now: the proxy (or the relay that
        # carries its events) is silent, which heartbeat_stale names; its workers are not to blame
        if s.queue_depth and waited >= _stall_limit(s) and now - s.ts <= fresh:
            workers = sorted(w.src for w in state.workers.values() if w.role == "teacher" and w.src != "teacher/proxy"
                             and w.phase not in TERMINAL_PHASES)
            vs = {w: verdict(state, state.workers[w], now, frozen_limits(cfg)[1]) for w in workers[:4]}
            verdicts = [f"{w}: {v.text}" for w, v in vs.items()]
            out.append(AlertEvent(
                severity="critical", code="teacher_not_serving", targets=workers or ["teacher/proxy"],
                message=f"the teacher server received {s.received}, served {s.served}, {s.queue_depth} waiting for "
                        f"{spoken(waited)}: its workers do not answer" + (f" ({'; '.join(verdicts)})" if verdicts else ""),
                hint="the teacher workers: their stacks (d), out of memory or dead (see the workers table); "
                     "restart (r) brings them back",
                evidence={"received": s.received, "served": s.served, "queue_depth": s.queue_depth,
                          "elapsed_s": round(waited, 1), "verdict": ",".join(v.word for v in vs.values()),
                          "where": ";".join(v.where for v in vs.values())}))
    return out


SLOW_ON_PURPOSE = ("checkpoint", "join_group", "resume", "load_data")
NO_STEP_FACTOR = 3.0
NO_STEP_MIN_S = 30.0


def no_progress(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Seed 001's "the log stopped for 2 minutes": every process alive (heartbeats flow) but no step
    for 3x the median step time."""
    ms = state.metrics[-33:]
    if state.state != "running" or len(ms) < 4:
        return []
    gaps = sorted(b.ts - a.ts for a, b in zip(ms, ms[1:]))
    median = gaps[len(gaps) // 2]
    since = now - max(ms[-1].ts, state.running_since)  # a restarted driver's init is not a stall
    driver = state.workers.get("driver")
    if driver is not None and (driver.phase.startswith("init") or driver.phase in SLOW_ON_PURPOSE):
        return []
    limit = max(NO_STEP_MIN_S, NO_STEP_FACTOR * median)
    alive = [w for w in state.workers.values() if w.last_heartbeat and now - w.last_heartbeat < cfg.stall_s]
    if since < limit or not alive or late_workers(state, now):  # a named straggler is the why already
        return []
    busy = sorted(((now - w.phase_since, w.src, w.phase) for w in alive if w.phase not in ("idle", "serve")),
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


PENDING_S = 30.0  # an actor Ray could place but has not, after this long, is worth a word


def _res(r: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(r.items())) or "nothing"


def unschedulable(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """Actors Ray cannot create (workers stuck at init): a demand no node can meet, said with the
    numbers, or a demand that waits for resources others hold."""
    groups: dict[tuple, list] = {}
    for w in state.workers.values():
        if w.ray_state == "PENDING_CREATION" and w.phase not in TERMINAL_PHASES:
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
            return (f"no node has {_res(lacking or b)} (the largest of {len(nodes)} node{'s' if len(nodes) > 1 else ''} "
                    f"has {_res(best)})")
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
    dropped = {w.src: w.dropped for w in state.workers.values() if w.dropped}
    if not dropped:
        return []
    return [AlertEvent(
        severity="info", code="events_dropped",
        message=f"{sum(dropped.values())} events dropped by {len(dropped)} sender(s) (queue full or supervisor away)",
        hint="the senders are too chatty or the supervisor too slow; counts only, the run goes on",
    )]


RULES: list[Callable[[RunState, float, Settings], list[AlertEvent]]] = [
    heartbeat_stale, stragglers, sync, collectives, teacher, no_progress, actor_dead, unschedulable,
    placement_groups, gpu_probe_hung, gpu_danger,
    bad_step, out_of_memory, driver_failed, events_dropped,
]
# codes these rules own: the supervisor clears them when their rule no longer returns them
CODES = vocab.codes(by="rules")
# codes whose message carries a growing number: re-sent only when severity, verdict or place change
LIVE = vocab.codes(live=True)
