"""The weight sync: the student broadcasts its weights over the collective group, every rollout
receives them, and each answers with a fingerprint that must equal the student's.

Each sync is a `sync` event stream (started, progress once a second with who is pending, then done,
timed_out, failed or cancelled). A cancelled sync tears the group down, makes a new one and syncs
again: the weights still have to reach the rollouts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gkd_core.errors import GkdError
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import Cancelled
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer.actions import Answer
from gkd_core.trainer.cluster import Cluster
from gkd_core.trainer.guarded import WaitTimeout, WorkerFailed, guarded_wait


class SyncCancelled(GkdError, RuntimeError):
    pass


def stragglers(pending: list[str]) -> list[str]:
    """The root's broadcast completes only when every receiver has taken its part, so a pending
    student is blocked by pending rollouts: they are the ones to name."""
    return [m for m in pending if m != "student/0"] or pending


class WeightSync:
    def __init__(self, cluster: Cluster, rep: Reporter, timeout_s: float):
        self.cluster, self.rep, self.timeout_s = cluster, rep, timeout_s
        self.sync_id = 0  # kept in checkpoints, so that ids go on across restarts
        self.on_tick: Callable[..., None] | None = None  # the driver's commands, served while the sync runs
        self._under_way = False  # a sync (or its retry after a cancel) is in progress
        self._cancels: list[Answer] = []  # the cancels asked of it, answered when it ends
        self._last = "none yet"  # how the newest sync ended

    def request_cancel(self, answer: Answer) -> None:
        """Cancel the sync under way: ``answer`` is told how it ended (cancelled and made again, or over before
        the cancel took hold); with none under way, told so at once. (Asked from the sync's own ticks: the
        driver serves its commands there, on this thread.)"""
        if not self._under_way:
            answer(False, f"no weight sync is under way (the last: {self._last})")
            return
        self._cancels.append(answer)

    def _answer_cancels(self, ok: bool, result: Cancelled | str) -> None:
        cancels, self._cancels = self._cancels, []
        for answer in cancels:
            answer(ok, result)

    def __call__(self, step: int) -> None:
        self._under_way = True
        try:
            self._sync(step)
        finally:
            self._under_way = False
            self._answer_cancels(False, f"{self._last} before the cancel took hold")

    def _sync(self, step: int) -> None:
        c = self.cluster
        self.sync_id += 1
        sid, timeout, members = self.sync_id, self.timeout_s, c.members
        t0 = time.monotonic()
        self.rep.emit(ev.SyncEvent(sync_id=sid, state="started", timeout_s=timeout, pending=members, step=step))
        refs = {"student/0": c.actors["student/0"].sync_send.remote(sid, step, timeout)}
        for m in members[1:]:
            refs[m] = c.actors[m].sync_rollout_weights.remote(sid, step, timeout)

        def tick(pending: list[str], elapsed: float) -> None:
            self.rep.emit(ev.SyncEvent(sync_id=sid, state="progress", timeout_s=timeout, elapsed_s=elapsed,
                                       pending=stragglers(pending), done=[m for m in members if m not in pending],
                                       step=step))
            if self.on_tick is not None:
                self.on_tick()
            if self._cancels:
                raise SyncCancelled(f"sync {sid} cancelled with {', '.join(pending)} pending")

        def ended(state: str, **kw) -> None:
            self._last = f"sync {sid} {state}"
            self.rep.emit(ev.SyncEvent(sync_id=sid, state=state, timeout_s=timeout, elapsed_s=time.monotonic() - t0,
                                       step=step, **kw))

        try:
            prints = guarded_wait(refs, timeout, phase="sync_weights", describe=c.describe, on_tick=tick,
                                  hint="dump their stacks (d); cancel the sync (c) or restart smaller (r)")
        except WaitTimeout as e:
            late = stragglers(e.pending)
            blocked = "student/0" in e.pending and late != e.pending
            done = ", ".join(f"{m} in {t:.1f} s" for m, t in sorted(e.done.items())) or "nobody"
            msg = (f"{', '.join(late)} did not finish sync_weights (sync {sid}, step {step}) within "
                   f"{timeout:g} s: " + "; ".join(f"{m} is {c.describe(m)}" for m in late)
                   + (" ; student/0 is blocked in its broadcast, waiting for them" if blocked else "")
                   + f"; finished: {done}; try: dump their stacks (d), then cancel the sync (c) or restart "
                   "smaller (r)")
            ended("timed_out", pending=late, done=sorted(e.done), error=msg)
            for m in e.pending:
                c.actors[m].cancel.remote()
            raise WaitTimeout(msg, late, e.done) from None
        except SyncCancelled as e:
            ended("cancelled", error=str(e))
            for m in members:
                c.actors[m].cancel.remote()
            assert c.group is not None  # (made in ``Cluster.start``, before any sync)
            try:
                c.group.rebuild()
            except Exception as rebuilt:
                self._answer_cancels(False, f"{e}, but making the group again failed: {rebuilt}"[:500])
                raise
            self._answer_cancels(True, Cancelled(target="sync", outcome=f"{e} after {time.monotonic() - t0:.1f} s; "
                                                                         f"the group was made again and sync "
                                                                         f"{sid + 1} sends the weights anew"))
            return self._sync(step)
        except WorkerFailed as e:
            ended("failed", pending=[e.name], blocked=e.blocked, error=str(e)[:1000])
            raise
        want = prints["student/0"]
        differ = [m for m in members[1:] if prints[m] != want]
        ended("done", done=members, fingerprint_ok=not differ, differ=differ,
              error="" if not differ else "rollout weights differ from the student's: "
              + "; ".join(f"{m} has {prints[m][:200]}" for m in differ) + f" (the student's: {want})")
