"""The run a command acts on, said the same way to every command: ``gkd-tui status RUN`` or
``gkd-tui status --run RUN``; left out, the latest run on this machine. ``cancel`` and
``dump-stacks`` take the workers they act on as their positional, so there the run is ``--run``."""

from __future__ import annotations

import argparse

RUN_HELP = "a run directory or run id (default: the latest run on this machine, $GKD_HOME/runs/latest)"


class OneRun(argparse.Action):
    """Stores the run into ``run``; the run given twice, differently, is an error that says so."""

    def __call__(self, parser, namespace, value, option_string=None):
        if value is None:  # the positional left out: --run may have said it
            return
        said = f"--run {value!r}" if option_string else repr(value)
        before = getattr(namespace, self.dest, None)
        if before is not None and before != value:
            parser.error(f"the run is given twice, differently: {namespace.run_said} and {said}; "
                         "give it once, as RUN or as --run RUN")
        setattr(namespace, self.dest, value)
        namespace.run_said = said  # how it was given, for that error


def add_run(parser: argparse.ArgumentParser, positional: bool = True, help: str = RUN_HELP) -> None:
    """``RUN`` and ``--run RUN`` (``positional=False``: ``--run RUN`` only), both into ``a.run``."""
    if positional:
        parser.add_argument("run", nargs="?", metavar="RUN", action=OneRun, default=None, help=help)
        parser.add_argument("--run", dest="run", metavar="RUN", action=OneRun, default=None,
                            help="the run, as an option (the same as RUN)")
    else:
        parser.add_argument("--run", dest="run", metavar="RUN", action=OneRun, default=None, help=help)
