"""``python -m gkd_tui``: the ``gkd-tui`` command, for a process that has the interpreter but not the script on
its PATH (the supervisor's recovery takes its bug report so)."""

import sys

from gkd_tui.cli import main

sys.exit(main())
