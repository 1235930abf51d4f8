"""What the dashboard's colours say, in one place: an alert's severity, a run's state, a log level,
and a worker named by an alert (its row takes the alert's colour)."""

from __future__ import annotations

SEVERITY_STYLE = {"critical": "bold white on red", "warn": "bold black on yellow", "info": "bold"}
# a row of the workers table named by an active alert of this severity
NAMED_ROW_STYLE = {"critical": "bold red", "warn": "bold yellow"}
STATE_STYLE = {"running": "bold green", "finished": "bold cyan", "failed": "bold red", "stopped": "bold yellow",
               "restarting": "bold yellow", "starting": "yellow"}
LEVEL_STYLE = {"error": "bold red", "warn": "yellow", "warning": "yellow"}
