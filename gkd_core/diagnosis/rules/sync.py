"""Rules on the weight sync and the collectives: a sync past its timeout, weights that do not match the
student's, a rank that has not joined a collective its peers are in."""

from __future__ import annotations

from gkd_core.diagnosis.rules.common import NCCL_TRY, Settings, frozen_limits
from gkd_core.diagnosis.stragglers import MIN_S
from gkd_core.state import RunState
from gkd_core.telemetry.events import AlertEvent
from gkd_core.units import spoken


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
