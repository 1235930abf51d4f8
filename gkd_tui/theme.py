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
    # the sparklines: loss, KL, agreement, the teacher's requests a second
    "series-loss": "ansi_magenta",
    "series-kl": "ansi_yellow",
    "series-agreement": "ansi_green",
    "series-rate": "ansi_cyan",
}
