"""Rules on the weight sync and the collectives: a sync past its timeout, one part of a sync far over its
usual time, weights that do not match the student's, a rank that has not joined a collective its peers
are in."""

from __future__ import annotations

import statistics

from gkd_core.diagnosis.rules.common import NCCL_TRY, SLOW_ON_PURPOSE, Settings
from gkd_core.diagnosis.stragglers import MIN_S, OWN_FACTOR, OWN_MIN_SAMPLES
from gkd_core.state import RunState
from gkd_core.state.views import heartbeat_at, usual_part_time
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import precise, spoken
from gkd_core.vocab import SYNC_OPEN, SYNC_PARTS


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


PART_HINTS = {
    "gather": "the weights' gather (their copy into one buffer) is slow: its stack (d); memory pressure or a "
              "device-to-host copy?",
    "broadcast": "a broadcast that does not finish waits on a peer that has not joined or cannot take its part: "
                 "dump the members' stacks (d); on NCCL, NCCL_DEBUG=INFO and the collectives pane",
    "load": "the engine's load of the new weights is slow: its stack (d) shows where (a reload from disk instead "
            "of in place, a frozen engine worker, memory pressure); cancel the sync (c) or restart smaller (r)",
    "reset_cache": "the engine's cache reset is slow: requests still running in the engine hold it (was generation "
                   "paused before the sync?): its stack (d)",
    "pause": "the rollout servers do not finish aborting their requests: a request stuck in an engine holds the "
             "pause (the servers' stacks, d; the driver's wait names the one it waits for)",
    "release_cache": "an engine does not free its KV cache: requests still in it, or the engine itself stuck (its "
                     "stack, d; the driver's wait names the server)",
    "group": "the sync's process group waits for a worker that has not joined (prepare, then init_process_group on "
             "every trainer and rollout worker): the driver's wait names it; its stack (d)",
    "resume_cache": "an engine does not take its KV cache back (memory it cannot get again?): its stack (d)",
    "resume": "a rollout server does not resume generation: its stack (d); the driver's wait names it",
}
SLOW_PART_CRITICAL = 4  # over this many times its limit (its usual time times OWN_FACTOR, or MIN_S), critical
# a wait inside a collective or a part of the sync this many times its usual is a stall, not a slow one: critical
# once past its floor (MIN_S), not at twice it. A rank or part that usually takes 20 ms and has taken 5 s is held,
# while one that usually takes 2 s and has taken 5 s may be slow: that one keeps the ladder
FAR_PAST = 50
INSIDE_MIN_SAMPLES = 4  # a group's waits inside its collectives seen before its usual one is said


def _usual_inside(state: RunState, group: str) -> float | None:
    """How long a rank of ``group`` usually waits inside one of its collectives (the median of the last ones)."""
    inside = state.collective_inside.get(group)
    return statistics.median(inside) if inside is not None and len(inside) >= INSIDE_MIN_SAMPLES else None


def sync_parts(state: RunState, now: float, cfg: Settings) -> list[AlertEvent]:
    """A member in one part of the current sync (gather, broadcast, load into the engine ...) far over that
    part's usual time (``usual_part_time``: the median of the syncs before, each its slowest member's): over
    ``OWN_FACTOR`` times it, and ``MIN_S``, once ``OWN_MIN_SAMPLES`` syncs had it. Named with its usual time."""
    s = state.sync
    if s is None or s.state not in SYNC_OPEN or not s.parts_now:
        return []
    out = []
    order = list(SYNC_PARTS)
    # a broadcast waits for every member to join it: one still in a part before it, or not done and in none (stuck
    # before its first part: a member the driver no longer calls pending, such as the broadcast's root, which it
    # takes for blocked by the rest), holds the others there
    before_broadcast = (any(order.index(at.part) < order.index("broadcast")
                            for at in s.parts_now.values() if at.part in SYNC_PARTS)
                        or bool(set(s.members or s.pending) - s.parts_now.keys() - set(s.done)))
    for member, at in sorted(s.parts_now.items()):
        if at.part == "broadcast" and before_broadcast:
            continue
        elapsed = now - at.since
        learned = usual_part_time(state.sync_history, at.part) if elapsed >= MIN_S else None
        if learned is None or learned[1] < OWN_MIN_SAMPLES:
            continue
        usual, n = learned
        limit = max(MIN_S, OWN_FACTOR * usual)
        if elapsed <= limit:
            continue
        words = SYNC_PARTS.get(at.part, at.part)
        step = f" (step {s.step})" if s.step is not None else ""
        out.append(AlertEvent(
            severity="critical" if elapsed > SLOW_PART_CRITICAL * limit or elapsed >= FAR_PAST * usual else "warn",
            code="sync_part_slow",
            message=f"sync {s.sync_id}{step}: {words} {spoken(elapsed)} on {member}, usually {precise(usual)} "
                    f"(the median of the last {n} syncs)",
            hint=PART_HINTS.get(at.part, "dump its stack (d); cancel the sync (c) or restart smaller (r)"),
            targets=[member],
            evidence={"sync_id": s.sync_id, "part": at.part, "elapsed_s": round(elapsed, 1),
                      "usual_s": round(usual, 3), "limit_s": round(limit, 2), "syncs": n}))
    return out


def parts_explain(alerts: list[AlertEvent]) -> list[AlertEvent]:
    """A member named for a slow part of the sync is not named again as late in the sync as a whole (a
    straggler in ``sync_weights`` beside its finished peers, or slower than its usual sync): one finding."""
    named = {t for a in alerts if a.code == "sync_part_slow" for t in a.targets}
    if not named:
        return alerts
    return [a for a in alerts if not (a.code in ("straggler", "slower_than_usual") and set(a.targets) <= named)]


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
    fresh = cfg.limits.fresh_s
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
        usual = _usual_inside(state, group)
        # past twice the floor; or at the floor already, when that is far past the group's usual wait inside, and no
        # rank it waits for is in a phase slow by design (rank 0's checkpoint while the others wait at a barrier)
        on_purpose = any(state.workers[m].phase in SLOW_ON_PURPOSE for m in missing if m in state.workers)
        severity = ("critical" if waited >= 2 * MIN_S
                    or (usual is not None and waited >= FAR_PAST * usual and not on_purpose) else "warn")
        said_usual = f"; usually {precise(usual)} inside one" if usual is not None else ""
        evidence = {"group": group, "seq": n, "op": op, "elapsed_s": round(waited, 1), "in": sorted(inside),
                    "world": world}
        if missing:
            doing = "; ".join(f"{m} is in {state.workers[m].phase or '?'}" for m in missing[:4] if m in state.workers)
            out.append(AlertEvent(
                severity=severity, code="collective_not_joined", targets=missing,
                message=f"{', '.join(missing[:6])}{' …' if len(missing) > 6 else ''} has not joined {what}; "
                        f"{len(inside)} peer(s) waiting for {spoken(waited)}{said_usual}"
                        + (f" ({doing})" if doing else "")
                        + (f"; {unseen} rank(s) never reported" if unseen > 0 else ""),
                hint="its stack (d) says what it does instead: a rank that skipped or reordered a collective, "
                     "an exception swallowed before it, or a hang earlier in its step; cancel (c) or restart (r)",
                evidence={**evidence, "missing": missing}))
        elif unseen <= 0 and all(members[w].left is not None for w in waiting):
            silent = [w for w in waiting if w in state.workers and (beat := heartbeat_at(state, state.workers[w]))
                      and now - beat > fresh]
            out.append(AlertEvent(
                severity=severity, code="collective_stuck", targets=silent or waiting,
                message=f"all {len(members)} ranks joined {what}; {', '.join(waiting[:6])} inside it for "
                        f"{spoken(waited)}{said_usual}"
                        + (f"; {', '.join(silent)} sends no heartbeat (frozen inside it)" if silent
                           else "; stuck in the transport"),
                hint=("the frozen rank's stack (d); it holds its peers in the collective" if silent else
                      f"every rank is in and none comes out: the transport (network, firewall, {NCCL_TRY})"),
                evidence={**evidence, "inside": waiting, "frozen": silent}))
    return out
