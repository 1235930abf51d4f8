"""The verl tests run where verl 0.9 is installed (CI makes a venv of its own for it: .ci/run); elsewhere
they are not collected, unless GKD_REQUIRE_VERL=1 says that verl must be here (CI), when they fail."""

import os

try:
    import verl  # noqa: F401
except ImportError as e:
    if os.environ.get("GKD_REQUIRE_VERL") == "1":
        raise RuntimeError(f"GKD_REQUIRE_VERL=1 but verl does not import here: {e}") from e
    collect_ignore_glob = ["test_*.py"]
