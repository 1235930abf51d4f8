"""A bug report in one archive (``b``, ``gkd-tui bundle``): what someone else needs to see why a run is stuck.

``summary.md`` at its top reads as the issue a user would file (what is wrong, where, what was tried,
the command, versions and hardware, the variables in effect, Ray's view, the tracebacks); beside it the
stacks taken for it on every node, Ray's view, the environment, and the run's config, event log, logs,
dumps and restart configs. Never keys, Ray's auth token or checkpoints.

    environment   RUN/driver.json: the driver's command and variables, secrets hidden, at its start
    probe         versions and hardware, read in a process of its own under a deadline
    report        summary.md, Ray's view, the tracebacks in the logs
    targets       the stacks the dump missed: workers that joined since, actors alive in Ray's view alone
    archive       the tar, every text scrubbed of the secrets this machine knows
"""

from gkd_core.bundle.archive import write_bundle
from gkd_core.bundle.report import StacksTaken, UnreportedActor

__all__ = ["StacksTaken", "UnreportedActor", "write_bundle"]
