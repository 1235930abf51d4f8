"""The stacks of a process's asyncio calls in flight: the ``await`` each is stuck at, which no thread shows.

An async actor's method that never returns is a coroutine suspended at an ``await``; py-spy and
faulthandler read threads, and the event loop's thread is idle in ``select``. ``asyncio``'s own
``Task.get_stack`` gives the task's outermost frame only (a suspended coroutine has no ``f_back``), so
the chain is walked here as Python keeps it: each coroutine's ``cr_await`` is the awaitable it waits on,
down to a future (or a generator's ``gi_yieldfrom``), each frame at the line it is suspended on.

The answer is written by the process's watcher thread when a capture asks (node/stacks.py's
``task_stack_files``: the process offers, the capture asks, the process answers), one block per call,
in faulthandler's frame format so stack_text reads it as it reads a thread.
"""

from __future__ import annotations

import atexit
import linecache
import os
import time
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from gkd_core.node.stacks import TaskStackFiles, task_stack_files

CHAIN_MAX = 64  # awaits followed down one call's chain (a recursion of coroutines ends somewhere)


def await_chain(coro: Any) -> tuple[list[FrameType], Any]:
    """The frames of ``coro`` and what it awaits, outermost first, and the last awaitable that is no
    coroutine (the future it waits on), or None."""
    frames: list[FrameType] = []
    awaited = coro
    for _ in range(CHAIN_MAX):
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        frames.append(frame)
        nxt = getattr(awaited, "cr_await", None)
        if nxt is None:
            nxt = getattr(awaited, "gi_yieldfrom", None)
        if nxt is None:
            return frames, None
        awaited = nxt
    return frames, (awaited if frames and awaited is not coro else None)


def describe(name: str, number: int, started: float, coro: Any, now: float) -> str:
    """One call's block: a header stack_text reads as a thread's, then its frames innermost first."""
    frames, future = await_chain(coro)
    lines = [f"Task {name} #{number} (asyncio), in flight {now - started:.1f} s, its awaits innermost first:"]
    if future is not None:
        lines.append(f"  awaiting {_short(future)}")
    for frame in reversed(frames):
        code = frame.f_code
        lines.append(f'  File "{code.co_filename}", line {frame.f_lineno} in {code.co_name}')
        source = linecache.getline(code.co_filename, frame.f_lineno).strip()
        if source:
            lines.append(f"    {source}")
    if not frames:
        lines.append("  (no frames: the call has just finished or not yet begun)")
    return "\n".join(lines)


def _short(awaitable: Any) -> str:
    if type(awaitable).__name__ == "FutureIter":  # ``await future`` in C: the future itself is out of reach
        return "a Future (pending: whatever was to set it has not)"
    text = repr(awaitable)
    return text if len(text) <= 160 else text[:157] + "..."


class TaskStackAnswer:
    """This process's side: it offers its asyncio calls' stacks (once it has had one) and answers a request."""

    def __init__(self, folder: Path):
        self.files: TaskStackFiles = task_stack_files(folder, os.getpid())
        self.offered = False

    def offer(self) -> None:
        if not self.offered:
            self.offered = True
            self.files.ready.parent.mkdir(parents=True, exist_ok=True)
            self.files.ready.touch()
            atexit.register(self.files.ready.unlink, missing_ok=True)  # (a process killed leaves it: see pid reuse)

    def answer_if_asked(self, calls: Iterable[tuple[str, int, float, Any]]) -> bool:
        """``calls``: (method, call number, start, coroutine) of each asyncio call in flight. The request is
        taken first (renamed: a reader asking meanwhile makes a new one, answered next), then the answer
        written whole under the tokens it answers (a reader never sees half an answer)."""
        if not self.offered or not self.files.asked.exists():
            return False
        taken = self.files.asked.with_suffix(".taken")
        try:
            os.replace(self.files.asked, taken)
            tokens = taken.read_text().split()
        except FileNotFoundError:
            return False
        now = time.time()
        blocks = [describe(name, number, started, coro, now) for name, number, started, coro in calls]
        text = "\n\n".join(blocks) if blocks else f"Task stacks of process {os.getpid()}: no asyncio call in flight"
        partial = self.files.answer.with_suffix(".part")
        partial.write_text(" ".join(tokens) + "\n" + text + "\n")
        os.replace(partial, self.files.answer)
        taken.unlink(missing_ok=True)
        return True
