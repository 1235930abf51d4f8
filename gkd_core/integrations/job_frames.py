"""Where the job's own code is in a stack: the first frame outside Python's library and the watching's own
patches, from a wait's or a set's caller outward, and the numbers that code holds (a gate's version).

data_waits asks it of every wait and set of asyncio's and threading's primitives in a watched process, so it
looks at each code file once (``_skipped``) and a frame's file name after that.
"""

from __future__ import annotations

import concurrent.futures
import os
import sysconfig
from types import FrameType

# frames skipped to find the line of the job's that waits or sets: Python's own library (the primitives, and
# what sets them for Ray: a concurrent.futures.Future chained to an asyncio task, set and waited on for every
# call of an async actor) and the patches' own file
STDLIB = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep
PATCHES = os.path.normcase(os.path.join(os.path.dirname(__file__), "data_waits.py"))
FUTURES_FILE = concurrent.futures._base.__file__  # (as a code object says its file name)
NUMBERS_MAX = 6  # numbers of the waiting code said with its wait (a gate's version and its bound)
_skipped_file: dict[str, bool] = {}  # a code's file name -> whether it is skipped (each looked at once)


def job_frame(frame: FrameType | None) -> FrameType | None:
    """The first frame of the job's own, from ``frame`` outward (Python's library's frames and the patches'
    skipped); None when there is none (code called from compiled code: Ray's, setting a Future)."""
    while frame is not None and _skipped(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def waited_by_job(frame: FrameType | None, not_the_jobs: tuple[str, ...]) -> bool:
    """Whether the code at ``frame`` (a wait's caller) is the job's: its first frame outside Python's library
    is in none of the folders ``not_the_jobs`` (ours, Ray's), and there is one (Ray waits on a Future for every
    call of an async actor, from its compiled code: none)."""
    where = job_frame(frame)
    return where is not None and not where.f_code.co_filename.startswith(not_the_jobs)


def set_by_job(frame: FrameType | None, not_the_jobs: tuple[str, ...]) -> bool:
    """``waited_by_job`` for a set's caller, and no Future's result: set once, it is never waited on after (a
    wait on it ends with the set), so nobody's edge; Ray sets one or two for every call of an async actor,
    each new."""
    while frame is not None:
        name = frame.f_code.co_filename
        if name == FUTURES_FILE:
            return False
        if not _skipped(name):
            return not name.startswith(not_the_jobs)
        frame = frame.f_back
    return False


def numbers(frame: FrameType) -> str:
    """The numbers the waiting code holds (its locals', and its ``self``'s public attributes'), at most
    ``NUMBERS_MAX``: ``version=3, produced=11``. Numbers only: a string can be a key."""
    found: dict[str, int | float] = {}
    f_locals = frame.f_locals
    owner = f_locals.get("self")
    for name, value in [*f_locals.items(), *(vars(owner).items() if hasattr(owner, "__dict__") else ())]:
        if (len(found) < NUMBERS_MAX and not name.startswith("_") and name not in found
                and type(value) in (int, float)):
            found[name] = value
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in found.items())


def _skipped(filename: str) -> bool:
    """Whether a frame of ``filename`` is Python's library's or the patches' (looked at once a file)."""
    known = _skipped_file.get(filename)
    if known is None:
        name = os.path.normcase(filename)
        known = _skipped_file[filename] = name == PATCHES or (
            name.startswith(STDLIB) and "site-packages" not in name and "dist-packages" not in name)
    return known
