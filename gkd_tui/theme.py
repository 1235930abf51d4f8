"""The dashboard's colours, as Textual theme variables: defined once here, as the app's defaults
(``GkdApp.get_theme_variable_defaults``), so that a theme may override any of them; app.tcss
styles everything with them, Python text included (``widgets/styles.py`` names those styles).

ANSI colours, so a terminal's own red reads as red; Textual draws them through its ANSI theme
unless the terminal's palette is asked for (``App.ansi_color``).
"""

from __future__ import annotations

THEME_VARIABLES = {
    # trouble now (a critical alert, a stale or dead worker, a sync past its timeout, an error line),
    # a warning (a straggler, a sync past half its timeout, a phase near its deadline), all well
    "severity-critical": "ansi_red",
    "severity-critical-text": "ansi_white",  # on the critical colour: the alert's badge, the NVML banner
    "severity-warn": "ansi_yellow",
    "severity-warn-text": "ansi_black",
    "severity-ok": "ansi_green",
    # the run's state, in the header
    "state-running": "ansi_green",
    "state-finished": "ansi_cyan",
    "state-failed": "ansi_red",
    "state-stopped": "ansi_yellow",
    "state-restarting": "ansi_yellow",
    "state-starting": "ansi_yellow",
    # the sparklines and plots: loss, KL, agreement, the teacher's requests a second (and in flight)
    "series-loss": "ansi_magenta",
    "series-kl": "ansi_yellow",
    "series-agreement": "ansi_green",
    "series-rate": "ansi_cyan",
    # the plots: a sync's time and its timeout; the teacher's latency and queue
    "series-sync": "ansi_cyan",
    "series-timeout": "ansi_red",
    "series-p50": "ansi_green",
    "series-p99": "ansi_yellow",
    "series-queue": "ansi_magenta",
    # a step's phases, stacked
    "series-phase-generate": "ansi_blue",
    "series-phase-wait": "ansi_white",
    "series-phase-teacher": "ansi_magenta",
    "series-phase-train": "ansi_green",
    "series-phase-sync": "ansi_cyan",
    "series-phase-eval": "ansi_yellow",
    "series-phase-other": "ansi_bright_black",
    # a line per GPU, and their mean
    "series-1": "ansi_green",
    "series-2": "ansi_cyan",
    "series-3": "ansi_magenta",
    "series-4": "ansi_yellow",
    "series-5": "ansi_blue",
    "series-6": "ansi_bright_green",
    "series-7": "ansi_bright_cyan",
    "series-8": "ansi_bright_magenta",
    "series-mean": "ansi_white",
}
