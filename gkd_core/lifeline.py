"""Tie the driver's life to its supervisor's (Linux): a run nobody records should not go on.

If the supervisor is killed, the driver gets SIGTERM and stops like on `gkd-tui stop`; the
latest checkpoint is where a new launch resumes. Like on `gkd-tui stop`, the SIGTERM reaches the
driver's whole process group: the local Ray cluster its ``ray.init`` started lives there.
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


def pass_sigterm_to_group() -> None:
    """From now on, a SIGTERM to this process goes to its whole process group first, then to the
    handler in place (Ray's, after ``ray.init``: ``sys.exit``).

    `gkd-tui stop` signals the driver's group itself; a supervisor killed -9 cannot, and the kernel's
    SIGTERM (``die_with_supervisor``) reaches the driver alone. Ray's shutdown then kills its control
    store and raylet, and Ray's agents in the group, left without them, spend 60 s trying to report
    it before they exit (ray/_private/process_watcher.py). Only where the driver leads its group (as
    the supervisor starts it): a driver started in a user's shell shares the shell job's group.
    Call after ``ray.init``, which sets its own handler."""
    if os.getpgrp() != os.getpid():
        return
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's signal comes back to us
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        except OSError:
            pass
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)
