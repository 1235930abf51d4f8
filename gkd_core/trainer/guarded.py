"""``guarded_wait``: every wait on Ray refs has a deadline and a name.

It waits for a set of named refs together under one deadline, calls ``on_tick`` about once a
second (progress events, control commands), and fails with the names of who is late — or who
died, as soon as Ray knows, not when the deadline expires.

``watchdog``: a deadline for a call that takes none of its own (``ray.init``, the first GCS
calls), without moving the call off the main thread, where Ray expects to be initialised.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError, TaskCancelledError

from gkd_core.errors import GkdError

EXIT_STUCK = 3  # the driver's exit code when a wait ran past its deadline or a worker died


class WaitTimeout(GkdError, TimeoutError):
    def __init__(self, message: str, pending: list[str], done: dict[str, float]):
        super().__init__(message)
        self.pending = pending
        self.done = done


class WorkerFailed(GkdError, RuntimeError):
    """``name`` is the cause; ``blocked``, the workers of the same wait that failed or cannot finish
    because of it (a broadcast's peers when one rank died): victims, not causes. ``died``: Ray says the
    cause's actor is dead (not a call of a live one that raised): one its driver may start again."""

    def __init__(self, message: str, name: str, blocked: list[str] | None = None, died: bool = False):
        super().__init__(message)
        self.name = name
        self.blocked = blocked or []
        self.died = died


# A worker whose process dies inside a collective makes its peers fail at once ("Connection closed by
# peer") while Ray says the death a moment later: a failure waits this long for a death among the others
# before it is taken as the cause
CAUSE_GRACE_S = 2.0


def guarded_wait(refs: dict[str, Any], timeout_s: float, *, phase: str, describe: Callable[[str], str] = str,
                 on_tick: Callable[[list[str], float], None] | None = None, tick_s: float = 1.0,
                 hint: str = "") -> dict[str, Any]:
    """Results by name, or ``WaitTimeout`` naming the stragglers, or ``WorkerFailed`` naming the dead."""
    start = time.monotonic()
    deadline = start + timeout_s
    by_ref = {ref: name for name, ref in refs.items()}
    pending = dict(refs)
    results: dict[str, Any] = {}
    done_at: dict[str, float] = {}
    next_tick = start + tick_s
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            names = sorted(pending)
            others = (f"; others finished in {max(done_at.values()):.1f} s" if done_at else "")
            who = "; ".join(f"{n} ({describe(n)})" for n in names)
            raise WaitTimeout(
                f"{', '.join(names)} did not finish {phase} within {timeout_s:g} s: {who}{others}"
                + (f"; try: {hint}" if hint else ""), names, done_at)
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending),
                            timeout=max(0.0, min(left, next_tick - time.monotonic(), 0.2)))
        for ref in ready:
            name = by_ref[ref]
            del pending[name]
            try:
                results[name] = ray.get(ref, timeout=30)
            except (RayActorError, TaskCancelledError) as e:
                blocked = sorted(pending)
                raise WorkerFailed(_died(name, describe, phase, e) + (
                    f"; {', '.join(blocked)} still in the same {phase}" if blocked else ""),
                    name, blocked=blocked, died=isinstance(e, RayActorError)) from None
            except RayTaskError as e:
                cause = e.cause if getattr(e, "cause", None) is not None else e
                said = f"{type(cause).__name__}: {str(cause).splitlines()[0][:300] if str(cause) else ''}"
                dead = _death_among(pending, min(CAUSE_GRACE_S, max(0.0, deadline - time.monotonic())))
                if dead is not None:  # it failed because a peer died: the dead one is the cause
                    who, err = dead
                    blocked = sorted(set(pending) - {who} | {name})
                    raise WorkerFailed(f"{_died(who, describe, phase, err)}; {name} failed in the same {phase} "
                                       f"because of it ({said[:200]})", who, blocked=blocked, died=True) from None
                raise WorkerFailed(f"{name} ({describe(name)}) failed in {phase}: {said}", name) from None
            except GetTimeoutError:
                raise WorkerFailed(f"{name}: its result of {phase} could not be fetched within 30 s", name) from None
            done_at[name] = time.monotonic() - start
        now = time.monotonic()
        if now >= next_tick:
            next_tick = now + tick_s
            if on_tick is not None and pending:
                on_tick(sorted(pending), now - start)
    return results


def _died(name: str, describe: Callable[[str], str], phase: str, e: BaseException) -> str:
    return (f"{name} ({describe(name)}) died or was cancelled during {phase}: "
            f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")


def _death_among(pending: dict[str, Any], within_s: float) -> tuple[str, BaseException] | None:
    """(name, Ray's error) of a worker among ``pending`` whose actor Ray says is dead within ``within_s``."""
    left = dict(pending)
    end = time.monotonic() + within_s
    while left:
        ready, _ = ray.wait(list(left.values()), num_returns=1, timeout=max(0.0, end - time.monotonic()))
        if not ready:
            return None
        name = next(n for n, r in left.items() if r == ready[0])
        del left[name]
        try:
            ray.get(ready[0], timeout=5)
        except RayActorError as e:
            return name, e
        except RayError:
            pass  # finished, or failed on its own: not a death
    return None


@contextmanager
def watchdog(what: str, timeout_s: float, on_expire: Callable[[str], None], hint: str = "") -> Iterator[None]:
    """Run the block on this thread; if it has not returned after ``timeout_s``, call
    ``on_expire(message)`` from a timer thread. The block cannot be interrupted from another
    thread, so ``on_expire`` is expected to report and end the process."""
    done = threading.Event()

    def expire() -> None:
        if not done.is_set():
            on_expire(f"{what} did not return within {timeout_s:g} s" + (f"; {hint}" if hint else ""))

    timer = threading.Timer(timeout_s, expire)
    timer.name, timer.daemon = f"watchdog: {what}", True
    timer.start()
    try:
        yield
    finally:
        done.set()
        timer.cancel()
