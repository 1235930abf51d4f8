"""When the rollouts generate, relative to the step that trains: the two schedulers.

The driver's loop calls the same four hooks for both; they differ only in when the next batch
is asked for and collected:

- ``sync``: generate step k's batch with the weights of step k-1, then score, train, sync; the
  next batch is asked for after the sync.
- ``one_step_off``: step k+1's batch is asked for as soon as step k's is in, so it is generated
  (with the weights of step k-1) while step k is scored and trained; it is collected before the
  sync, which needs the rollouts idle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gkd_core.telemetry.reporter import Reporter


class Scheduler(Protocol):
    """What the driver's loop asks of a schedule: when generation is launched and collected."""

    def start(self, first: int) -> None: ...

    def batch(self, step: int): ...

    def during_train(self, step: int, last: bool) -> None: ...

    def before_sync(self, step: int, last: bool) -> None: ...

    def after_sync(self, step: int, last: bool) -> None: ...

    def again(self, resend: Callable) -> None:
        """The batch in flight sent again (``resend(pending)``): a rollout generating it was replaced."""


class SyncScheduler:
    def __init__(self, launch: Callable, collect: Callable, rep: Reporter):
        self.launch, self.collect, self.rep = launch, collect, rep
        self.pending = None

    def start(self, first: int) -> None:
        self.pending = self.launch(first)

    def batch(self, step: int):
        return self.collect(self.pending, step)

    def during_train(self, step: int, last: bool) -> None:
        pass

    def before_sync(self, step: int, last: bool) -> None:
        pass

    def after_sync(self, step: int, last: bool) -> None:
        if not last:
            self.pending = self.launch(step + 1)

    def again(self, resend: Callable) -> None:
        self.pending = resend(self.pending)


class OneStepOffScheduler:
    def __init__(self, launch: Callable, collect: Callable, rep: Reporter):
        self.launch, self.collect, self.rep = launch, collect, rep
        self.pending = None
        self.ready = None

    def start(self, first: int) -> None:
        self.pending = self.launch(first)

    def batch(self, step: int):
        batch, self.ready = self.ready if self.ready is not None else self.collect(self.pending, step), None
        return batch

    def during_train(self, step: int, last: bool) -> None:
        if not last:
            self.pending = self.launch(step + 1)  # overlaps the teacher and the training

    def before_sync(self, step: int, last: bool) -> None:
        if not last:
            with self.rep.phase("generate", step=step + 1, detail="waiting for the next batch"):
                self.ready = self.collect(self.pending, step + 1)

    def after_sync(self, step: int, last: bool) -> None:
        pass

    def again(self, resend: Callable) -> None:
        self.pending = resend(self.pending)  # (a batch already collected, ``ready``, stays)


SCHEDULERS: dict[str, Callable[..., Scheduler]] = {"sync": SyncScheduler, "one_step_off": OneStepOffScheduler}
