"""Stack text put in the order a person reads it: the threads running your code first.

A py-spy dump of a Ray actor lists the main thread first, and that thread is Ray's own task
loop; the thread stuck in ``sync_rollout_weights`` comes fourth or fifth. The viewer moves the
threads with frames outside the libraries to the top (keeping every thread, in their order
otherwise). It reads the three formats the capture methods produce: py-spy, faulthandler and
Python's own traceback.
"""

from __future__ import annotations

import re

# frames from these are plumbing: Ray's loops, thread pools, our own reporter thread
LIBRARY = ("site-packages", "/ray/", "ray/_private", "_raylet", "threading.py", "concurrent/futures", "selectors.py",
           "queue.py", "socket.py", "asyncio/", "zmq/", "gkd_core/telemetry", "gkd_core/node", "(libc", "(libpython")
THREAD_START = re.compile(r"^(Thread \S+|Current thread \S+)")
FRAME = re.compile(r"\.py[:\"]|\.py, line")


def is_user_frame(line: str) -> bool:
    return bool(FRAME.search(line)) and not any(lib in line for lib in LIBRARY)


def user_threads_first(text: str) -> str:
    head: list[str] = []
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if THREAD_START.match(line):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
        else:
            head.append(line)
    if len(blocks) < 2:
        return text
    ranked = sorted(blocks, key=lambda b: not any(is_user_frame(line) for line in b[1:]))
    return "\n".join(head + [line for b in ranked for line in b])
