"""What the dashboard's colours say, by name: an alert's severity, a run's state, a log level, a
worker something is wrong with (its row), a sparkline. Each name is a component class of the panes
(``Pane``) and of the workers table, styled in app.tcss with the theme variables of
``gkd_tui/theme.py``: Python chooses what a piece of text is; how it looks is the stylesheet's."""

from __future__ import annotations

from gkd_core.vocab import RUN_STATUSES, SEVERITIES

# the same words in every pane: wrong now (bold red), failed (red), a warning (bold yellow),
# caution (yellow), well (green); done (dim: a worker that has finished)
TROUBLE, FAILURE, WARNING, CAUTION, OK, DONE = (
    "tone--trouble", "tone--failure", "tone--warning", "tone--caution", "tone--ok", "tone--done")
SEVERITY = {s: f"severity--{s}" for s in SEVERITIES}
NO_ALERTS = "severity--none"
STATE = {s: f"state--{s}" for s in RUN_STATUSES}
LEVEL = {"error": TROUBLE, "warn": CAUTION, "warning": CAUTION}
# a row of the workers table named by an active alert of this severity
NAMED_ROW = {"critical": TROUBLE, "warn": WARNING}
SERIES = {name: f"series--{name}" for name in ("loss", "kl", "agreement", "rate")}

PANE_CLASSES = {TROUBLE, FAILURE, WARNING, CAUTION, OK, *SEVERITY.values(), NO_ALERTS, *STATE.values(),
                *SERIES.values()}
ROW_CLASSES = {TROUBLE, FAILURE, WARNING, CAUTION, DONE}
