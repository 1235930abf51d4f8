"""The supervisor's part for nobody watching (DESIGN §14): its alerts told to people (``notify``), its
state to Prometheus (``metrics``), both off the ingest's path, and the run restarted by a policy (``recovery``).

The loop hands it each alert as it is recorded (``alert``: O(1)) and calls ``tick`` with its chores: the
notifier's outcomes go on the record as ``action`` events (``op`` "notify": to whom, which alert, delivered or
not, after how many tries, why not), and the scrapes waiting are answered from the state. The metrics'
HTTP server binds 127.0.0.1 unless told otherwise, and never 0.0.0.0 by default.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server

from gkd_core.config import RecoveryConfig
from gkd_core.notify import Notifier, Outcome
from gkd_core.state import RunState
from gkd_core.supervisor.metrics import Scrapes, SupervisorCounts
from gkd_core.supervisor.recovery import Recovery, RecoveryPolicy
from gkd_core.supervisor.unattended_settings import UnattendedConfig
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Notified

OUTCOMES_KEEP = 256  # outcomes not recorded yet (the loop records them every tick)


def unattended_part(told: UnattendedConfig | None, recovery: RecoveryConfig, run_dir: Path,
                    act: Callable[[ops.Args, str], object], stop: Callable[[str], None]) -> Unattended | None:
    """The run's part for nobody watching, or None when it was told nothing: ``told`` (the command line's and
    the user's settings), over the run config's ``recovery`` section; ``act`` (an op carried out as the
    recovery's) and ``stop``: the supervisor's, for the recovery."""
    told = told or UnattendedConfig()
    policy = RecoveryPolicy(
        codes=frozenset(told.restart_on or recovery.restart_on),
        grace_s=recovery.grace_s if told.restart_grace_s is None else told.restart_grace_s,
        per_hour=recovery.per_hour if told.restarts_per_hour is None else told.restarts_per_hour,
        backoff_s=recovery.backoff_s)
    if not (told or policy):
        return None
    return Unattended(told, run_dir.name, f"gkd-tui attach {run_dir}",
                      Recovery(policy, run_dir, act, stop) if policy else None)


class Unattended:
    def __init__(self, cfg: UnattendedConfig, run: str, attach: str, recovery: Recovery | None = None):
        self.counts = SupervisorCounts()
        self._outcomes: collections.deque[Outcome] = collections.deque(maxlen=OUTCOMES_KEEP)
        self._lock = threading.Lock()
        self.notifier = (Notifier(cfg.notify_urls, cfg.notify_commands, run, attach, self._heard,
                                  quiet_s=cfg.quiet_s) if cfg.notify_urls or cfg.notify_commands else None)
        self.recovery = recovery
        if recovery is not None and self.notifier is not None:
            recovery.tell = self.notifier.tell  # each restart told where the alerts go
        self.scrapes: Scrapes | None = None
        self._server = None
        self.metrics_address = ""
        self.trouble = ""  # what went wrong starting it, said on the record at the first tick (the run goes on)
        if cfg.metrics_port:
            registry = CollectorRegistry(auto_describe=False)
            scrapes = Scrapes()
            registry.register(scrapes)
            try:
                self._server, _ = start_http_server(cfg.metrics_port, addr=cfg.metrics_host, registry=registry)
            except OSError as e:  # a port in use, an address not of this node: no metrics, the run goes on
                self.trouble = (f"/metrics not served: {cfg.metrics_host}:{cfg.metrics_port}: {e.strerror or e}; "
                                "give another --metrics-port (or metrics.port in GKD_HOME/unattended.yaml)")
            else:
                self.scrapes = scrapes
                self.metrics_address = f"http://{cfg.metrics_host}:{self._server.server_address[1]}/metrics"

    def alert(self, alert: ev.AlertEvent) -> None:
        """An alert the run recorded (on the loop, as it is recorded)."""
        if self.notifier is not None:
            self.notifier.alert(alert)

    def tick(self, st: RunState, now: float, emit: Callable[[ev.Event], None], events: int = 0,
             rejected: int = 0) -> None:
        """The loop's chores: the notifier's outcomes on the record, the waiting scrapes answered (``events``:
        taken in so far, ``rejected``: refused)."""
        self.counts.events, self.counts.rejected = events, rejected
        if self.trouble:
            emit(ev.LogEvent(level="warn", message=self.trouble))
            self.trouble = ""
        with self._lock:
            heard = list(self._outcomes)
            self._outcomes.clear()
        for o in heard:
            emit(ev.ActionEvent(op="notify", by="supervisor", ok=o.ok, result=Notified(
                to=o.to, alert=o.code, targets=list(o.targets), kind=o.kind, tries=o.tries, error=o.error)))
        if self.scrapes is not None:
            self.scrapes.answer(st, now, self.counts)
        if self.recovery is not None:
            self.recovery.tick(st, now, emit)

    def may_restart(self, st: RunState) -> bool:
        """The recovery may yet restart this ended run (``Recovery.may_restart``)."""
        return self.recovery is not None and self.recovery.may_restart(st)

    def close(self) -> None:
        if self.recovery is not None:
            self.recovery.close()
        if self.notifier is not None:
            self.notifier.close()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def _heard(self, outcome: Outcome) -> None:  # (the notifier's thread)
        with self._lock:
            self._outcomes.append(outcome)
