"""Which halves of a comparison a bench can run here, said in one line its smoke prints.

A bench that compares two things (the torch engine and vLLM, this trainer and TRL, two plotting widgets)
runs the other half only where its package is installed: a venv without it runs this project's half
alone and says so. ``GKD_SMOKE_REQUIRE`` (space-separated packages: CI sets it where each one is
installed) turns "alone" into a failure, so CI cannot pass a smoke whose comparison never ran.
"""

from __future__ import annotations

import importlib.util
import os
import sys


def other_half(package: str, ours: str, theirs: str, bench: str) -> bool:
    """Whether ``theirs`` (needing ``package``) runs beside ``ours``; printed as the bench's "halves:" line.
    Exits 1 when it cannot and ``GKD_SMOKE_REQUIRE`` names ``package``."""
    if importlib.util.find_spec(package) is not None:
        print(f"halves: {ours} and {theirs}", flush=True)
        return True
    print(f"halves: {ours} alone ({theirs} needs {package}, which this venv does not have)", flush=True)
    if package in os.environ.get("GKD_SMOKE_REQUIRE", "").split():
        sys.exit(f"{bench}: GKD_SMOKE_REQUIRE names {package}, but it is not installed in this venv "
                 f"({sys.prefix}): install it, or run the bench where it is")
    return False
