"""The faults the driver fires on the teacher (``kill_teacher``, ``delay_teacher``, ``error_teacher``; typed in
``faults``), at a step's start, and the killed teacher brought back after the fault's ``seconds``."""

from __future__ import annotations

import time

from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer.cluster import Cluster
from gkd_core.trainer.faults import FaultPlan, kill_as_the_kernel_would


class TeacherFaults:
    """The faults the driver fires on the teacher at a step's start (``kill_teacher``: its workers killed and not
    started again; ``delay_teacher``: each answer late for one step), and the killed workers brought back after the
    fault's ``seconds`` (``back``: asked during every wait on the teacher)."""

    def __init__(self, plan: FaultPlan, cluster: Cluster, rep: Reporter):
        self.plan, self.cluster, self.rep = plan, cluster, rep
        self._back_at: float | None = None

    def at_step(self, step: int) -> None:
        c = self.cluster
        teachers = c.teacher_workers()
        f = self.plan.at("kill_teacher", step)
        if f:
            self.rep.log(f"fault injected: killing {', '.join(teachers)} at step {step}", level="warn")
            for n in teachers:
                kill_as_the_kernel_would(n, c.actors.pop(n), self.rep)  # popped: the driver does not start it again
            if f.seconds:
                self._back_at = time.monotonic() + f.seconds
        f = self.plan.at("delay_teacher", step)
        if f:
            self.rep.log(f"fault injected: {', '.join(teachers)} answer {f.seconds:g} s late from step {step}",
                         level="warn")
            for n in teachers:
                c.actors[n].set_delay.remote(f.seconds)
        f = self.plan.at("error_teacher", step)
        if f:
            for n in teachers:
                c.actors[n].set_errors.remote(f.seconds)
        if self.plan.ends("delay_teacher", step):
            for n in c.teacher_workers():
                c.actors[n].set_delay.remote(0.0)

    def back(self) -> None:
        if self._back_at is not None and time.monotonic() >= self._back_at:
            self._back_at = None
            self.rep.log("fault: bringing the teacher workers back", level="warn")
            self.cluster.start_teacher()
