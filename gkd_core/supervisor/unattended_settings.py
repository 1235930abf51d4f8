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

    def __bool__(self) -> bool:
        return bool(self.notify_urls or self.notify_commands or self.metrics_port)


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


def settings(home: Path, urls: list[str], commands: list[str], port: int | None, host: str | None
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

    A file that is not that shape is an error that says where and what (``ValueError``); nothing starts."""
    path = home / SETTINGS_FILE
    mine = _Settings()
    if path.exists():
        try:
            mine = msgspec.convert(yaml.safe_load(path.read_text()) or {}, _Settings)
        except (yaml.YAMLError, msgspec.ValidationError) as e:
            raise ValueError(f"{path}: {e}; its keys are notify.urls, notify.commands, notify.quiet_s, "
                             "metrics.port and metrics.host") from e
    return UnattendedConfig(notify_urls=[*mine.notify.urls, *urls], notify_commands=[*mine.notify.commands, *commands],
                            quiet_s=mine.notify.quiet_s, metrics_port=mine.metrics.port if port is None else port,
                            metrics_host=host or mine.metrics.host)


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


def to_env(cfg: UnattendedConfig) -> dict[str, str]:
    """The settings for a supervisor ``launch`` starts, in its environment (``ENV``), not on its command line:
    a process's arguments are anyone's to read on the node, its environment only its user's."""
    return {ENV: json.dumps(dataclasses.asdict(cfg))} if cfg else {}


def from_env() -> UnattendedConfig | None:
    """The settings ``to_env`` gave this process, taken out of its environment (its driver does not inherit
    them); None when none were given."""
    given = os.environ.pop(ENV, None)
    return UnattendedConfig(**json.loads(given)) if given else None
