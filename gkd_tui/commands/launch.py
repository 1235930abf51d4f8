"""``gkd-tui launch``: a run started detached (its own session, like tmux), then attached."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gkd_core import rundir
from gkd_core.config import ConfigError, load_config
from gkd_core.supervisor import unattended_settings
from gkd_tui.commands.attach import cmd_attach
from gkd_tui.commands.reach import NotStarted, start_detached


def config_and_overrides(a: argparse.Namespace) -> tuple[str | None, list[str]]:
    """`launch trainer.total_steps=5` has no config file: its first word is an override."""
    cfg_path, overrides = a.config, list(a.overrides)
    if cfg_path and "=" in cfg_path and not Path(cfg_path).exists():
        overrides.insert(0, cfg_path)
        cfg_path = None
    return cfg_path, overrides


def cmd_launch(a: argparse.Namespace) -> int:
    cfg_path, overrides = config_and_overrides(a)
    try:
        load_config(cfg_path, overrides)  # refuse a bad config here, before anything starts
    except ConfigError as e:
        print(f"gkd-tui: invalid config: {e}", file=sys.stderr)
        return 2
    try:  # and the webhooks and metrics port, handed over in the supervisor's environment (never its arguments)
        told = unattended_settings.settings(rundir.gkd_home(), a.notify, a.notify_command, a.metrics_port,
                                            a.metrics_host, a.restart_on, a.restart_grace, a.restart_budget)
    except ValueError as e:
        print(f"gkd-tui: invalid unattended settings: {e}", file=sys.stderr)
        return 2
    command = a.command
    try:
        run, pid = start_detached([*([cfg_path] if cfg_path else []), *overrides, "--linger", str(a.linger),
                                   *(["--", *command] if command else [])],
                                  env={**os.environ, **unattended_settings.to_env(told)})
    except NotStarted as e:
        print(f"gkd-tui: {e}", file=sys.stderr)
        return 1
    print(f"gkd-tui: launched run {run.name} (supervisor pid {pid}) in {run}", file=sys.stderr)
    if a.detach:
        return 0
    a.run = str(run)
    return cmd_attach(a)
