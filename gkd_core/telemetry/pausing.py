"""A driver's pause between steps (``pause`` and ``resume``: ``ops.PauseArgs``, ``ops.ResumeArgs``).

Asked at any moment, a pause holds the driver at the end of the step under way: its phase ``paused`` (which
the diagnosis takes as slow on purpose, not as a run that stopped making progress), every other request
still served meanwhile, until a ``resume`` or the pause's own deadline (``for_s``: a pause that nobody ends
must end, and says so). Users of async jobs ask for it to look at a run in peace (a checkpoint, a queue's
depth, a server's log) without losing it. Our trainer's driver and the demo driver hold here; a watched
job's driver has no steps of ours to hold between, and refuses.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Paused, Resumed
from gkd_core.telemetry.commands import Reply
from gkd_core.telemetry.reporter import Reporter
from gkd_core.units import spoken
from gkd_core.vocab import PAUSED


class Pause:
    def __init__(self, rep: Reporter):
        self.rep = rep
        self.until: float | None = None  # (monotonic) while a pause is asked for or held: when it ends by itself
        self.by = ""  # who asked for it
        self.held_since: float | None = None  # (monotonic) while the driver is held

    def asked(self, args: ops.PauseArgs, reply: Reply) -> None:
        """A pause asked for (again: its deadline moved), answered."""
        self.until, self.by = time.monotonic() + args.for_s, reply.by
        if self.held_since is not None:
            said = f"paused already; now for {spoken(args.for_s)} more"
        else:
            said = f"pauses at the end of the step under way, for {spoken(args.for_s)} at most"
        reply(True, Paused(outcome=said + " (`gkd-tui resume`, or P in the dashboard, goes on)", for_s=args.for_s))

    def resumed(self, args: ops.ResumeArgs, reply: Reply) -> None:
        """A resume, answered (refused when there is no pause to end)."""
        if self.until is None:
            reply(False, "the driver is not paused")
            return
        self.until = None
        if self.held_since is None:
            reply(True, Resumed(outcome="the pause asked for is called off: it had not begun"))
        else:
            reply(True, Resumed(outcome=f"resumed after {spoken(time.monotonic() - self.held_since)} paused"))

    def hold(self, step: int | None, serve: Callable[[float], None]) -> None:
        """At a step's end: while a pause is asked for, the driver waits here, ``serve(timeout_s)`` waiting up to
        that long for its requests (a resume among them) and carrying them out, until the pause ends."""
        if self.until is None:
            return
        self.held_since = time.monotonic()
        shown: float | None = None
        try:
            with self.rep.phase(PAUSED, step=step):
                while self.until is not None and (left := self.until - time.monotonic()) > 0:
                    if self.until != shown:  # (asked again: a later end)
                        shown = self.until
                        self.rep.set_phase(PAUSED, step=step, deadline=time.time() + left,
                                           detail=f"paused by {self.by}, for {spoken(left)} at most; "
                                                  "`gkd-tui resume` or P goes on")
                    serve(min(left, 1.0))
                if self.until is not None:
                    self.rep.log(f"the pause {self.by} asked for ended by itself at its deadline; training goes on",
                                 level="warn")
        finally:
            self.until = self.held_since = None
