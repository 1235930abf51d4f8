"""gkd_tui: the terminal dashboard and command line for gkd_core runs."""
