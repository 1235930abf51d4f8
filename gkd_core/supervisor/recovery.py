"""Recovery without a person (DESIGN §14): when a critical alert of a listed kind has held for its grace
period, the run is restarted, within a budget of restarts an hour and with a growing wait between them; once
the budget is spent it is not restarted again, and that is said loudly. Off unless asked for.

Where every worker the alert names is one its driver starts again in its place (``WorkerState.replaceable``: the
bundled trainer's teacher, and its rollouts with ``trainer.replace_rollouts``), that worker alone is stopped
(``cancel`` with force, through the driver) and the run goes on: the driver starts it again, and the step with it.
If the same alert still holds REPLACE_WAIT_S after, the whole run is restarted as above. A replacement counts in
the budget as a restart does; it waits for no back-off (it restarts no driver).

``decide`` is pure (the state, ``now`` and the restarts it made so far in, a decision out); ``Recovery``
carries its decisions out in the supervisor's loop (the bug report first, then the restart) and records them.
The restart waits for the report's live part (every worker's stacks, Ray's view): what a restart destroys. The
archive of the run's files is written beside the new driver, at a low priority (a night's event log is hundreds
of MB: scrubbed and compressed, a minute that nobody watching needs to wait for).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from gkd_core.state import RunState
from gkd_core.supervisor.control_ops import Refused
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Recovered, RecoverySaid

HOUR_S = 3600.0
# a driver that ran this long before its alert was no crash loop: the wait starts again. A loop fails in its
# first minute (an import, a model that does not fit, a deadlock at the first step); Kubernetes waits 10 min
# for a container, but a run that trained for two minutes and then hung is a new fault, not a loop (the ETTR
# bench's hour at 300 s: two faults 4 minutes after the one before waited 208 s and 310 s to be restarted)
HEALTHY_RESET_S = 120.0
REPORT_STACKS_S = 10.0  # the bug report's wait for every worker's stacks
REPORT_DEADLINE_S = 90.0  # the whole report's; past it, the restart goes ahead without it (the run comes first)
# the old driver's time to stop before it is killed: its run is hung and its report taken, and a graceful stop
# waits on the very workers it hangs on (Ray's shutdown behind a frozen actor took the run's whole 10 s)
STOP_S = 3.0
# a worker replaced in place has this long to be up and the alert gone (a new actor's start: its imports, its
# model, the group made anew, the weights synced), else the run is restarted
REPLACE_WAIT_S = 60.0


@dataclass(frozen=True)
class RecoveryPolicy:
    """``codes``: the alerts' codes that restart a run once one of them, critical, has held ``grace_s``; at most
    ``per_hour`` restarts in any hour, the n-th waiting ``backoff_s * 2**(n-1)`` after the one before while they
    come in a loop (each driver's alert within ``HEALTHY_RESET_S`` of its start), ``backoff_s`` after a driver
    that ran longer."""

    codes: frozenset[str] = field(default_factory=frozenset)
    grace_s: float = 60.0
    per_hour: int = 3
    backoff_s: float = 30.0

    def __bool__(self) -> bool:
        return bool(self.codes)

    def said(self) -> str:
        return (f"restart on {', '.join(sorted(self.codes))} once critical for {self.grace_s:g} s, the bug report "
                f"taken first; at most {self.per_hour} an hour")


class Decision(NamedTuple):
    """What to do now: ``restart`` for ``code`` on ``targets`` (held ``held_s``), or ``replace`` the targets
    alone; or ``spent``: the budget is spent and nothing is done (said once)."""

    action: str  # "restart", "replace" or "spent"
    code: str
    targets: list[str]
    held_s: float
    reason: str


def decide(policy: RecoveryPolicy, st: RunState, now: float, made: list[float],
           replaced: list[tuple[float, list[str]]] | None = None) -> Decision | None:
    """The decision for now, or None (nothing held long enough, or the next restart's wait is not over).
    ``made``: when this policy restarted the run before (its times, oldest first); ``replaced``: when it replaced
    workers in place, and which (``None``: it cannot, every recovery is a restart)."""
    if not policy:
        return None
    if made and st.running_since <= made[-1]:
        return None  # the restart's driver has not started yet: what holds now is the old one's
    can_replace, replaced = replaced is not None, replaced or []
    # held since it was raised, or since this driver started (an alert of the driver before may still stand: a
    # run that failed again between two of the diagnosis' passes keeps its finding, never cleared)
    held = [(max(a.since, st.running_since), a) for a in st.active_alerts()
            if a.severity == "critical" and a.code in policy.codes]
    held = [(since, a) for since, a in held if now - since >= policy.grace_s]
    if not held:
        return None
    since, a = min(held, key=lambda held: held[0])
    lately = [t for t in [*made, *(t for t, _ in replaced)] if now - t < HOUR_S]
    if len(lately) >= policy.per_hour:
        return Decision("spent", a.code, list(a.targets), now - since,
                        f"{len(lately)} restarts in the last hour (the budget is {policy.per_hour}): not restarted "
                        f"again; {a.code} has held {now - since:.0f} s")
    # the workers named, replaced in place: given REPLACE_WAIT_S to be up (what is said of them meanwhile is of the
    # old one's end or the new one's start); then an alert that held since before was no cure (the whole run), and
    # one raised since is replaced again
    if can_replace and a.targets and all((w := st.workers.get(t)) is not None and w.replaceable for t in a.targets):
        last = max((t for t, who in replaced if set(who) & set(a.targets)), default=0.0)
        if now - last < REPLACE_WAIT_S:
            return None
        if last < since:
            return Decision("replace", a.code, list(a.targets), now - since,
                            f"{a.code} on {', '.join(a.targets[:3])} held {now - since:.0f} s (the grace period is "
                            f"{policy.grace_s:g} s): replaced in place, {len(lately) + 1} of {policy.per_hour} "
                            "recoveries this hour")
    # the wait doubles with each restart of a crash loop, and starts again from backoff_s once a driver has run
    # HEALTHY_RESET_S before its alert (Kubernetes resets its back-off so): faults minutes apart are not a loop
    made_lately = [t for t in made if now - t < HOUR_S]
    streak = 0 if since - st.running_since >= HEALTHY_RESET_S else max(len(made_lately) - 1, 0)
    if made and now - made[-1] < policy.backoff_s * 2 ** streak:
        return None
    return Decision("restart", a.code, list(a.targets), now - since,
                    f"{a.code} on {', '.join(a.targets[:3]) or 'the run'} held {now - since:.0f} s (the grace "
                    f"period is {policy.grace_s:g} s): restart {len(lately) + 1} of {policy.per_hour} this hour")


class Recovery:
    """Carries ``decide``'s decisions out, across the supervisor's ticks and never blocking them: the bug report
    first, by ``gkd-tui bundle`` in a process of its own (it takes every worker's stacks through the run's
    control socket, which the loop goes on answering meanwhile), then the restart, or the workers stopped for
    their driver to replace (the ``restart`` or ``cancel`` op, by ``act``, given why); each on the record as a
    ``recover`` action and told (``tell``: where the alerts go). The budget spent: a
    critical alert (``restart_budget_spent``, notified as every critical one is) and the run stopped (``stop``)."""

    def __init__(self, policy: RecoveryPolicy, run_dir: Path, act: Callable[[ops.Args, str], object],
                 stop: Callable[[str], None], tell: Callable[[str, str, list[str], str], None] | None = None):
        """``act(args, why)``: the op carried out as a person's request would be (``restart``; ``cancel`` with force
        of a worker its driver replaces, aimed at its pid), raising ``Refused`` when it cannot be."""
        self.policy, self.run_dir = policy, run_dir
        self._act, self._stop, self.tell = act, stop, tell
        self.made: list[float] = []  # when it restarted the run (wall clock), oldest first
        self.replaced: list[tuple[float, list[str]]] = []  # when it replaced workers in place, and which
        self.spent = False
        self._report: subprocess.Popen | None = None  # the bug report being taken, for ``_due``
        self._report_path = self._report_log = self._report_live = run_dir
        self._writing: list[tuple[subprocess.Popen, Path, Path]] = []  # reports whose archive is being written
        self._report_by = 0.0
        self._due: Decision | None = None
        self._due_pids: dict[str, int] = {}  # the processes the decision was about (a replacement stops only them)
        self._said = False

    def said(self) -> str:
        """The policy and where it stands, as ``gkd-tui status`` says it."""
        return (f"{self.policy.said()}; {len(self.made)} made"
                + (f", {len(self.replaced)} replacement(s) of workers in place" if self.replaced else "")
                + ("; its budget is spent: not restarted again" if self.spent else ""))

    def tick(self, st: RunState, now: float, emit: Callable[[ev.Event], None]) -> None:
        if not self._said:  # on the record from the start: `status` says the run has it
            self._said = True
            self._record(emit)
        if self._writing:
            self._written(emit)
        if self._report is not None:
            self._after_report(now, emit)
            return
        if self.spent or st.state not in ("running", "failed"):  # (a failed run's supervisor can start it again)
            return
        d = decide(self.policy, st, now, self.made, self.replaced)
        if d is None:
            return
        if d.action == "spent":
            self.spent = True
            emit(ev.AlertEvent(
                severity="critical", code="restart_budget_spent", targets=d.targets,
                message=f"the recovery restarted the run {len(self.made)} time(s) and {d.reason}; the run is stopped",
                hint="a person is needed: read the bug reports (RUN/bundles/recovery-*.tar.gz), fix the cause, "
                     "then `gkd-tui restart`"))
            self._record(emit)
            self._stop(f"the recovery's budget is spent ({d.reason})")
            return
        self._due = d
        self._due_pids = {t: w.pid for t in d.targets if (w := st.workers.get(t)) is not None}
        n = len(self.made) + len(self.replaced) + 1
        self._report_path = self.run_dir / "bundles" / f"recovery-{n:03d}.tar.gz"
        self._report_log = self.run_dir / "logs" / f"recovery-{n:03d}.log"
        self._report_live = self.run_dir / "bundles" / f".recovery-{n:03d}.live"
        self._report_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._report_log, "ab") as log:
            self._report = subprocess.Popen(
                [sys.executable, "-m", "gkd_tui", "bundle", str(self.run_dir), "-o", str(self._report_path),
                 "--stacks-timeout", str(REPORT_STACKS_S), "--live-taken", str(self._report_live)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        self._report_by = now + REPORT_DEADLINE_S
        emit(ev.ActionEvent(op="recover", by="recovery", ok=True,
                            result=Recovered(stage="report", code=d.code, targets=d.targets, reason=d.reason)))

    def may_restart(self, st: RunState) -> bool:
        """A failed run this policy is about to restart (its report being taken, or a listed critical alert
        holding, the budget not spent): its supervisor stays for it."""
        if self._report is not None:
            return True
        if self.spent or st.state != "failed" or (self.made and st.running_since <= self.made[-1]):
            return False  # (the last restart refused: no driver since, none to come from here)
        return any(a.severity == "critical" and a.code in self.policy.codes for a in st.active_alerts())

    def close(self) -> None:
        """The run ends: a report still taking its live part is ended with it (one writing its archive of the
        run's files, in a session of its own, finishes by itself)."""
        if self._report is not None and self._report.poll() is None:
            _kill_group(self._report)

    def _after_report(self, now: float, emit: Callable[[ev.Event], None]) -> None:
        report, d = self._report, self._due
        assert report is not None and d is not None  # (set together)
        if report.poll() is None and self._report_live.exists():  # the live part taken: the archive follows
            self._writing.append((report, self._report_path, self._report_log))
            taken = str(self._report_path.relative_to(self.run_dir))
        elif report.poll() is None:
            if now < self._report_by:
                return
            _kill_group(report)
            taken = f"not finished in {REPORT_DEADLINE_S:g} s ({self._report_log.relative_to(self.run_dir)})"
        elif report.returncode == 0 and self._report_path.exists():
            taken = str(self._report_path.relative_to(self.run_dir))
        else:
            taken = f"`gkd-tui bundle` exited {report.returncode} ({self._report_log.relative_to(self.run_dir)})"
        with contextlib.suppress(FileNotFoundError):
            self._report_live.unlink()
        self._report, self._due = None, None
        why = f"{d.reason}; the bug report: {taken}"
        if d.action == "replace" and self._in_place(d, why, taken, now, emit):
            return
        self.made.append(now)  # (a restart refused counts too: the next waits, and the budget ends the tries)
        try:
            self._act(ops.RestartArgs(grace_s=STOP_S), why)
        except Refused as e:  # stopping meanwhile, a restart a person asked for first, a job it cannot start
            emit(ev.ActionEvent(op="recover", by="recovery", ok=False,
                                result=Recovered(stage="restart", code=d.code, targets=d.targets, report=taken,
                                                 error=str(e))))
            self._record(emit)
            return
        emit(ev.ActionEvent(op="recover", by="recovery", ok=True,
                            result=Recovered(stage="restart", code=d.code, targets=d.targets, report=taken,
                                             restart=len(self.made), reason=d.reason)))
        self._record(emit)
        if self.tell is not None:
            self.tell("restart", d.code, d.targets, why)

    def _in_place(self, d: Decision, why: str, taken: str, now: float, emit: Callable[[ev.Event], None]) -> bool:
        """The workers of ``d`` stopped for their driver to replace; False when that was refused (no driver to
        ask, say): the run is restarted instead."""
        try:
            for target, pid in self._due_pids.items():  # (only if still that process: its driver may have replaced it)
                self._act(ops.CancelArgs(target=target, mode="force", pid=pid), why)
        except Refused as e:
            emit(ev.ActionEvent(op="recover", by="recovery", ok=False,
                                result=Recovered(stage="replace", code=d.code, targets=d.targets, report=taken,
                                                 error=f"{e}; the run is restarted instead")))
            return False
        self.replaced.append((now, list(d.targets)))
        emit(ev.ActionEvent(op="recover", by="recovery", ok=True,
                            result=Recovered(stage="replace", code=d.code, targets=d.targets, report=taken,
                                             reason=d.reason)))
        self._record(emit)
        if self.tell is not None:
            self.tell("replace", d.code, d.targets, why)
        return True

    def _written(self, emit: Callable[[ev.Event], None]) -> None:
        """The archives written since the restarts they came before, on the record (or why one is not)."""
        for entry in list(self._writing):
            report, path, log = entry
            if report.poll() is None:
                continue
            self._writing.remove(entry)
            ok = report.returncode == 0 and path.exists()
            emit(ev.ActionEvent(op="recover", by="recovery", ok=ok, result=Recovered(
                stage="report_written", report=str(path.relative_to(self.run_dir)),
                error="" if ok else f"`gkd-tui bundle` exited {report.returncode} ({log.relative_to(self.run_dir)})")))

    def _record(self, emit: Callable[[ev.Event], None]) -> None:
        emit(ev.ActionEvent(op="recovery", by="supervisor", ok=True, result=RecoverySaid(said_now=self.said())))


def _kill_group(p: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)  # (its session: the probe it started goes with it)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(5)
