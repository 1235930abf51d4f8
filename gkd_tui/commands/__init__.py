"""The commands of ``gkd-tui``, a module per family; ``gkd_tui/cli.py`` holds the parser and ``main``."""
