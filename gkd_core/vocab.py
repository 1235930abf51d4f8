"""The project's words, each defined once: a run's states, a sync's, a worker's last phases, an
alert's severities, a worker's id, and the alert codes (who raises each, and what the rest of the
project does with it).

Rules, the cascade, the restart plan and the dashboard read their lists from ``ALERTS`` instead of
spelling the codes again; ``tests/unit/test_vocab.py`` checks that every code raised anywhere is here and
every code here is raised somewhere (or marked reserved). On the wire these are plain strings (a
newer writer's new word is kept, not refused); here they are the words this reader knows.
"""

from __future__ import annotations

import re
from typing import Literal, NamedTuple, get_args

Severity = Literal["critical", "warn", "info"]
SEVERITIES: tuple[str, ...] = get_args(Severity)  # the most urgent first
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}  # a word this reader does not know: after them all

# a run's ``run`` events, in the order a run goes through them
RunStatus = Literal["starting", "running", "restarting", "finished", "failed", "stopped"]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)
RUN_ENDED = ("finished", "failed", "stopped")  # the run is over: its driver is gone and none comes
RUN_GOING = ("starting", "running", "restarting")  # a driver is (being) started: its workers are new

SyncStatus = Literal["started", "progress", "done", "timed_out", "failed", "cancelled"]
SYNC_OPEN = ("started", "progress")  # a sync that has not ended
SYNC_FAILED = ("timed_out", "failed", "cancelled")  # one that ended without its weights everywhere
# the parts of a weight sync (``sync_part`` events), in the order a sync runs them, and how a person says each:
# our trainer's (gather to verify), and around them those of verl's checkpoint engine (its manager pauses the
# rollout servers, frees their KV cache and builds the sync's process group first, and undoes it after)
SYNC_PARTS = {
    "pause": "pause generation (abort the engines' requests)", "release_cache": "free the engines' KV cache",
    "group": "build the sync's process group",
    "gather": "gather the weights", "broadcast": "broadcast", "load": "load into the engine",
    "reset_cache": "reset the engine's cache", "verify": "read back the fingerprint",
    "resume_cache": "restore the engines' KV cache", "resume": "resume generation",
}
TRAINER_SYNC_PARTS = ("gather", "broadcast", "load", "reset_cache", "verify")  # the ones our trainer runs

PAUSED = "paused"  # the phase of a driver held between steps by a pause (telemetry/pausing)
# a worker's phase once it has stopped working: nothing it does is late any more
WORKER_ENDED = ("finished", "failed", "cancelled", "exited")
CPU_IDLE_PCT = 10.0  # a heartbeat below this CPU share counts as no progress


class WorkerId(NamedTuple):
    """A worker's ``src``: ``role/rank`` for ours (``rollout/3``) and a foreign job's ranks, or any
    name with a slash (a Ray actor: ``RolloutWorker/ab12``; ``pg/global_pool``), its rank None."""

    role: str
    rank: int | None

    @classmethod
    def parse(cls, src: str) -> WorkerId:
        """The role is before the last slash, the rank after it: ASCII digits only, and few
        (``str.isdigit`` is true of "²", which int() refuses, and int() refuses 4,300 digits too)."""
        role, _, rest = src.rpartition("/")
        if not role:
            return cls(src, None)
        return cls(role, int(rest) if rest.isascii() and rest.isdigit() and len(rest) <= 18 else None)


class HttpWait(NamedTuple):
    """A request this worker sent over HTTP and awaits, as its phase's ``waits_on`` says it: ``http POST
    127.0.0.1:8000/generate @4121``: the method, the server's address and the path (never the query string
    or headers), and the process listening on that address on the sender's node (0: none there, so another
    node's or a server outside the job). The diagnosis finds the worker of that pid on that node."""

    method: str
    address: str  # host:port
    path: str
    pid: int

    def said(self) -> str:
        return f"http {self.method} {self.address}{self.path} @{self.pid}"

    @classmethod
    def parse(cls, said: str) -> HttpWait | None:
        """The wait ``said`` describes, or None when it is no HTTP wait (an actor call's ``Worker.method``)."""
        if not said.startswith("http "):
            return None
        method, _, rest = said[5:].partition(" ")
        where, _, pid = rest.rpartition(" @")
        host, slash, path = where.partition("/")
        if not method or not host or not pid.isascii() or not pid.isdigit():
            return None
        return cls(method, host, slash + path, int(pid[:18]))

    def route(self) -> str:
        """``POST /generate on 127.0.0.1:8000``."""
        return f"{self.method} {self.path or '/'} on {self.address}"

    def spoken(self, server: str = "") -> str:
        """Its route, and who serves it: ``server`` (a worker), else its pid or "not served on this node"."""
        who = server or (f"pid {self.pid}" if self.pid else "not served on this node")
        return f"{self.route()} ({who})"


def is_loopback(address: str) -> bool:
    """Whether ``host:port`` is a loopback address: every node's own, so never another node's server."""
    host = address.rpartition(":")[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


# a served HTTP request's call, as a server's phase and its flow's calls name it: "POST /generate"
SERVED_ROUTE = re.compile(r"^[A-Z]+ /")


class DataWait(NamedTuple):
    """A call of a worker's waiting on data: a queue's get, a gate's Event or Condition (asyncio's or
    threading's), as its phase's ``waits_on`` says it: ``data put_sample,requeue``: the worker's own methods
    whose calls set it before (an Event set, a Condition notified, a queue put into). It waits on whoever
    calls them (their ``sends`` say), not on the worker itself; or a thread of the worker's own that set it
    (``of_thread``). ``methods`` empty: nothing has set it yet."""

    methods: tuple[str, ...]

    @staticmethod
    def of_thread(name: str, alive: bool) -> str:
        """A setter that is no call but a thread of the worker's own (a producer thread): ``~name``, and
        ``~name!`` once it has ended."""
        return f"~{name.replace(',', ' ')}" + ("" if alive else "!")

    @staticmethod
    def thread(method: str) -> str:
        """The thread's name of a setter ``of_thread`` said ("" for a method)."""
        return method[1:].removesuffix("!") if method.startswith("~") else ""

    @staticmethod
    def ended(method: str) -> bool:
        """Whether the setter is a thread that has ended."""
        return method.startswith("~") and method.endswith("!")

    def said(self) -> str:
        return f"data {','.join(self.methods)}".rstrip()

    @classmethod
    def parse(cls, said: str) -> DataWait | None:
        """The wait ``said`` describes, or None when it is no wait on data."""
        if said != "data" and not said.startswith("data "):
            return None
        return cls(tuple(m for m in said[5:].split(",") if m))


def src_of(role: str, rank: int | str) -> str:
    """The ``src`` of a worker (``src_of("rollout", 3)``), of a node's agent (``src_of("agent", node)``)."""
    return f"{role}/{rank}"

Raiser = Literal["rules", "supervisor", "driver", "ray_state"]


class Code(NamedTuple):
    by: Raiser  # "rules": a finding of the diagnosis, judged anew each pass and cleared when it no longer holds
    word: str = ""  # the worker table's word for a worker it names ("stale"); "" when it names none that way
    live: bool = False  # its message carries a growing number: re-sent only when severity, verdict or place change
    stacks: bool = False  # the workers it names get their stacks taken at once, and again a moment later
    cause: bool = False  # it names a cause: the workers held up by it are listed and marked blocked (cascade)
    late: bool = False  # it names a worker late or gone: the restart plan runs one rollout worker fewer
    reserved: bool = False  # raised by nothing yet: kept for a reader of older runs' logs, or a rule to come


ALERTS: dict[str, Code] = {
    "heartbeat_stale": Code("rules", "stale", live=True, stacks=True, cause=True, late=True),
    "straggler": Code("rules", "straggler", live=True, stacks=True, late=True),
    "slower_than_usual": Code("rules", "slow", live=True, stacks=True),
    "slower_than_peers": Code("rules", "slower than peers", live=True),
    "sync_slow": Code("rules", "sync slow", live=True),
    "sync_part_slow": Code("rules", "sync part slow", live=True, stacks=True),
    "sync_timed_out": Code("rules", "sync timed out", late=True),
    "sync_failed": Code("rules"),
    "fingerprint_mismatch": Code("rules"),
    "teacher_unreached": Code("rules", live=True, cause=True),
    "teacher_owed": Code("rules", live=True),
    "teacher_not_serving": Code("rules", live=True, stacks=True, cause=True),
    "teacher_errors": Code("rules", "answers errors", live=True, cause=True),
    "no_progress": Code("rules", "no progress", live=True),
    "actor_dead": Code("rules", "dead", cause=True, late=True),
    "unschedulable": Code("rules", "unschedulable", live=True),
    "gpu_probe_hung": Code("rules", live=True),
    "gpu_idle_full": Code("rules", live=True),
    "gpu_unbalanced": Code("rules", live=True),
    "bad_step": Code("rules"),
    "out_of_memory": Code("rules", "out of memory"),
    "memory_growing": Code("rules", "memory growing", live=True),
    "oom_killed": Code("rules", "OOM-killed", cause=True, late=True),
    "node_memory_low": Code("rules", live=True),
    "driver_failed": Code("rules", "failed"),
    "events_dropped": Code("rules"),
    "collective_not_joined": Code("rules", "not in collective", live=True, stacks=True, cause=True, late=True),
    "collective_stuck": Code("rules", "stuck in collective", live=True, stacks=True, cause=True),
    "deadlock": Code("rules", "deadlock", live=True, stacks=True, cause=True),
    "producer_parked": Code("rules", "parked", live=True, stacks=True, cause=True),
    "external_wait": Code("rules", "waiting outside", live=True, stacks=True, cause=True),
    "producer_died": Code("rules", "producer dead", stacks=True, cause=True),
    "ingest_rejected": Code("supervisor"),
    "auth_refused": Code("supervisor"),
    "restart_budget_spent": Code("supervisor"),  # recovery's restarts this hour used up: a person is needed
    "restarted_by_driver": Code("driver", "restarted"),
    "disk_low": Code("driver"),
    "ray_unreachable": Code("ray_state"),
}


def codes(**having: object) -> tuple[str, ...]:
    """The codes whose fields equal ``having`` (``codes(by="rules")``, ``codes(live=True)``), in table order."""
    return tuple(c for c, k in ALERTS.items() if all(getattr(k, f) == v for f, v in having.items()))
