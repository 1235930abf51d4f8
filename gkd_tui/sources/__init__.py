"""Where a dashboard's events come from: a live run (ZeroMQ) or a recorded one (replay); a Ray cluster
looked at from outside is a live run too (supervisor/drivers.py). Each is a ``Source``: a RunState under a
lock, the clock it is read at, and the capabilities its kind has, declared (None where it has none) so that
the app asks no object what it happens to have."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from gkd_core.state import RunState

T = TypeVar("T")

if TYPE_CHECKING:
    from gkd_core.telemetry import events as ev
    from gkd_core.telemetry.control import ControlClient
    from gkd_tui.sources.log_follower import LogFollower


class Playback(Protocol):
    """A recorded run's clock: what the replay keys drive."""

    def tick(self, wall_dt: float) -> None: ...
    def toggle(self) -> None: ...
    def step(self) -> None: ...
    def to_end(self) -> None: ...
    def to_start(self) -> None: ...
    def faster(self, up: bool) -> None: ...


class Source(Protocol):
    # the capabilities are read-only here: a source has each as an attribute, a property or a method
    # the state's lock; notified after each batch of events applied, so that a wait for an answer (``wait_for``)
    # wakes when the state may hold it, never polls
    lock: threading.Condition

    @property
    def state(self) -> RunState: ...
    @property
    def run(self) -> Path | None: ...  # its run directory (for the bundle), None when it has none
    # a new control client for the dashboard's actions (a live run's supervisor), or None
    @property
    def control(self) -> Callable[[], ControlClient] | None: ...
    @property
    def playback(self) -> Playback | None: ...  # a replay's clock, or None
    @property
    def logs(self) -> LogFollower | None: ...  # RUN/logs followed, or None
    # told of each action event that answers a request, as it comes (a live run's; set by the dashboard)
    on_action: Callable[[ev.ActionEvent], None] | None

    def now(self) -> float: ...
    def describe(self) -> str: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def wait_for(source: Source, answer: Callable[[RunState], T | None], timeout_s: float) -> T | None:
    """``answer(state)`` once it is not None (asked again each time the source applies events), or None when
    ``timeout_s`` passes first."""
    got: T | None = None

    def answered() -> bool:
        nonlocal got
        got = answer(source.state)
        return got is not None

    with source.lock:
        source.lock.wait_for(answered, timeout_s)
    return got
