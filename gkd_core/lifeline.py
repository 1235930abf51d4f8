"""Tie the driver's life to its supervisor's (Linux): a run nobody records should not go on.

If the supervisor is killed, the driver gets SIGTERM and stops like on `gkd-tui stop`; the
latest checkpoint is where a new launch resumes.
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int, expected_parent: int | None) -> bool:
    """Ask the kernel to send ``sig`` when our parent dies; True when that is in place."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if expected_parent and os.getppid() != expected_parent:
        os.kill(os.getpid(), sig)  # the parent died before we could ask
    return True


def die_with_supervisor(sig: int = signal.SIGTERM) -> bool:
    expected = os.environ.get("GKD_SUPERVISOR_PID")
    return die_with_parent(sig, int(expected) if expected else None)
