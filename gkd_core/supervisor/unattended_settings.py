"""What a run is told to do when nobody watches it (DESIGN §14): the webhooks and commands its alerts go to and
the port its metrics are served on, from the command line (``add_arguments``) over the user's own
``GKD_HOME/unattended.yaml`` (``settings``), and handed by ``launch`` to the supervisor it starts in its
environment (``to_env``, ``from_env``). Light to import: the command line reads it at every start; the running
part is ``unattended``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import yaml

from gkd_core.config.loading import unknown_codes

ENV = "GKD_UNATTENDED"  # the settings ``launch`` hands the supervisor it starts (``to_env``)
SETTINGS_FILE = "unattended.yaml"  # in GKD_HOME: the user's webhooks and metrics port, for every run they start


@dataclass(frozen=True)
class UnattendedConfig:
    """Where a run's alerts and metrics go: ``notify_urls`` (webhooks), ``notify_commands`` (shell commands
    given the JSON on stdin), ``metrics_port`` (0: no endpoint) on ``metrics_host``."""

    notify_urls: list[str] = field(default_factory=list)
    notify_commands: list[str] = field(default_factory=list)
    quiet_s: float = 600.0
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # recovery (supervisor/recovery.py), over the run config's ``recovery:``: the codes, and what was given
    restart_on: list[str] = field(default_factory=list)
    restart_grace_s: float | None = None
    restarts_per_hour: int | None = None

    def __bool__(self) -> bool:
        return bool(self.notify_urls or self.notify_commands or self.metrics_port or self.restart_on)


class _Notify(msgspec.Struct, forbid_unknown_fields=True):
    urls: list[str] = []
    commands: list[str] = []
    quiet_s: float = 600.0


class _Metrics(msgspec.Struct, forbid_unknown_fields=True):
    port: int = 0
    host: str = "127.0.0.1"


class _Settings(msgspec.Struct, forbid_unknown_fields=True):
    notify: _Notify = msgspec.field(default_factory=_Notify)
    metrics: _Metrics = msgspec.field(default_factory=_Metrics)


def settings(home: Path, urls: list[str], commands: list[str], port: int | None, host: str | None,
             restart_on: list[str] | None = None, grace_s: float | None = None, per_hour: int | None = None
             ) -> UnattendedConfig:
    """What a run is told to do unattended: the command line's (``urls``, ``commands``, ``port``, ``host``)
    over the user's own ``GKD_HOME/unattended.yaml`` (their webhooks for every run they start, ``launch --``
    included)::

        notify:
          urls: [https://hooks.slack.com/services/...]
          commands: ["mail -s gkd-alert me@example.com"]
          quiet_s: 600
        metrics:
          port: 9464

    The recovery's (``restart_on``: codes, one or a comma-separated list each; ``grace_s``; ``per_hour``) is the
    command line's alone: a restart policy is a run's, not every run's. A file that is not that shape, or a code
    that is no alert's, is an error that says where and what (``ValueError``); nothing starts."""
    path = home / SETTINGS_FILE
    mine = _Settings()
    if path.exists():
        try:
            mine = msgspec.convert(yaml.safe_load(path.read_text()) or {}, _Settings)
        except (yaml.YAMLError, msgspec.ValidationError) as e:
            raise ValueError(f"{path}: {e}; its keys are notify.urls, notify.commands, notify.quiet_s, "
                             "metrics.port and metrics.host") from e
    codes = [c.strip() for given in restart_on or [] for c in given.split(",") if c.strip()]
    if wrong := unknown_codes(codes):
        raise ValueError(f"--restart-on: {wrong}")
    if grace_s is not None and not grace_s >= 0:
        raise ValueError(f"--restart-grace {grace_s}: must be 0 (at once) or more seconds")
    if per_hour is not None and per_hour < 1:
        raise ValueError(f"--restart-budget {per_hour}: must be at least 1 restart an hour")
    return UnattendedConfig(notify_urls=[*mine.notify.urls, *urls], notify_commands=[*mine.notify.commands, *commands],
                            quiet_s=mine.notify.quiet_s, metrics_port=mine.metrics.port if port is None else port,
                            metrics_host=host or mine.metrics.host, restart_on=codes, restart_grace_s=grace_s,
                            restarts_per_hour=per_hour)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command line's unattended settings (``gkd-tui launch`` and ``python -m gkd_core run`` alike)."""
    parser.add_argument("--notify", action="append", default=[], metavar="URL",
                        help="post each new critical alert, and its clearing, to this webhook (repeatable; "
                             "Slack-compatible JSON)")
    parser.add_argument("--notify-command", action="append", default=[], metavar="CMD",
                        help="run this shell command with the same JSON on its stdin (repeatable)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="N",
                        help="serve /metrics for Prometheus on this port (off by default)")
    parser.add_argument("--metrics-host", default=None, metavar="HOST",
                        help="the address /metrics binds (default 127.0.0.1)")
    parser.add_argument("--restart-on", action="append", default=[], metavar="CODE,…",
                        help="restart the run when a critical alert of these codes has held --restart-grace "
                             "seconds, the bug report taken first (repeatable; off by default; also recovery: in "
                             "the run config)")
    parser.add_argument("--restart-grace", type=float, default=None, metavar="S",
                        help="how long such an alert holds before the restart (default 60)")
    parser.add_argument("--restart-budget", type=int, default=None, metavar="N",
                        help="at most N such restarts in any hour, then none, said loudly (default 3)")


def to_env(cfg: UnattendedConfig) -> dict[str, str]:
    """The settings for a supervisor ``launch`` starts, in its environment (``ENV``), not on its command line:
    a process's arguments are anyone's to read on the node, its environment only its user's."""
    return {ENV: json.dumps(dataclasses.asdict(cfg))} if cfg else {}


def from_env() -> UnattendedConfig | None:
    """The settings ``to_env`` gave this process, taken out of its environment (its driver does not inherit
    them); None when none were given."""
    given = os.environ.pop(ENV, None)
    return UnattendedConfig(**json.loads(given)) if given else None
