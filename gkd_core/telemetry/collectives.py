"""Where each rank stands in its collectives: per process group, the last collective it entered and the
last it left, for the rule that names the rank that has not joined collective #N (diagnosis.rules).

Two sources, one record (``CollectiveProgress``):

- our own wrappers (``TRACKER``): the trainer's weight sync says when it enters a broadcast and when it
  leaves it. Exact on any backend.
- PyTorch's Flight Recorder, where a job turned it on (``TORCH_FR_BUFFER_SIZE``): its per-group status
  (last enqueued, started, completed collective) and, for the op of the last one, its active entries.
  On NCCL it marks completion; on gloo it never does, so a gloo group read from it says only who has
  entered what (which is what "has not joined" needs).

A process's Reporter reads ``snapshot()`` at each heartbeat and sends a ``collectives`` event when it
changed: a frozen rank's last word is what it had entered, which is the evidence. Nothing here imports
torch: a process that never imported ``torch.distributed`` has no groups.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import weakref

import msgspec

from gkd_core.telemetry.events import CollectiveProgress

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level

FR_ENV = "TORCH_FR_BUFFER_SIZE"
# "0": no tracking in this process: our wrappers record nothing and the Flight Recorder is not read
# (job_env then leaves the recorder off too). What tracking costs a step: bench/bench_step_tracking.py
SWITCH_ENV = "GKD_COLLECTIVES"
DTYPE_BYTES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Byte": 1,
               "Char": 1, "Bool": 1}


class Tracker:
    """Our wrappers' book: thread-safe, O(groups) to read."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self._lock = threading.Lock()
        self._groups: dict[str, CollectiveProgress] = {}
        self.version = 0  # bumped at every change, which a Reporter sends at its next wake-up
        self._listeners: list = []

    def listen(self, wake) -> None:
        """``wake()`` (a bound method, held weakly) after each change: a Reporter's, to send it now, for a
        rank that freezes a moment after it entered a collective must have said so."""
        with self._lock:
            self._listeners = [w for w in self._listeners if w() is not None] + [weakref.WeakMethod(wake)]

    def _changed(self, wake: bool = False) -> None:
        """Bumps the version (a Reporter sends the change at its next wake-up, a heartbeat at the latest);
        entering a collective wakes it now: a rank may freeze in there a moment later."""
        self.version += 1
        for ref in list(self._listeners) if wake else ():
            fn = ref()
            if fn is not None:
                fn()

    def joined(self, group: str, rank: int, world: int) -> None:
        """A (new) group: its sequence starts again."""
        if not self.on:
            return
        with self._lock:
            self._groups[group] = CollectiveProgress(group=group, rank=rank, world=world)
        self._changed()

    def left_group(self, group: str) -> None:
        with self._lock:
            self._groups.pop(group, None)
        self._changed()

    def enter(self, group: str, op: str, nbytes: int = 0) -> int:
        with self._lock:
            g = self._groups.get(group)
            if g is None:
                return 0
            g.entered += 1
            g.op, g.nbytes, g.entered_at = op, nbytes, time.time()
            seq = g.entered
        self._changed(wake=True)
        return seq

    def leave(self, group: str, seq: int) -> None:
        with self._lock:
            g = self._groups.get(group)
            if g is None or not seq or seq > g.entered:
                return
            g.left, g.left_at = seq, time.time()
        self._changed()

    def snapshot(self) -> list[CollectiveProgress]:
        with self._lock:
            return [msgspec.structs.replace(g) for g in self._groups.values()]


def tracking(environ=os.environ) -> bool:
    return environ.get(SWITCH_ENV, "1").strip() != "0"


TRACKER = Tracker(on=tracking())


def flight_recorder() -> list[CollectiveProgress]:
    """This process's groups as the Flight Recorder sees them; [] where it is off or torch.distributed
    was never imported here. Each read takes the groups' status alone (microseconds); the entries, for
    the op and size of a group's last collective, only once that collective has stayed the last one for
    a read (a stall: what an alert would name), and once per collective: with its buffer full, a dump of
    the entries takes milliseconds, and gloo leaves them all "active"."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or not TRACKER.on or not _recording() or not c10d.is_initialized():
        return []
    from torch._C._distributed_c10d import _dump_fr_trace_json  # type: ignore[attr-defined]  # (private: no stub)

    status = json.loads(_dump_fr_trace_json(includeCollectives=False)).get("pg_status") or {}
    now = time.time()
    groups = []
    for pg, name in list(c10d._world.pg_names.items()):
        st = status.get(name)
        if st is not None:
            entered = max(0, int(st.get("last_enqueued_collective", -1)))
            groups.append((pg, name, entered, int(st.get("last_completed_collective", -1))))
    stalled = [name for _, name, entered, _ in groups
               if entered and _first_seen.get(("entered", name), (-1, now))[0] == entered
               and _op_of.get(name, (-1,))[0] != entered]
    if stalled:
        _read_ops(_dump_fr_trace_json, set(stalled))
    out = []
    for pg, name, entered, completed in groups:
        seq, op, size = _op_of.get(name, (0, "", 0))
        nccl = str(c10d.get_backend(pg)) == "nccl"
        out.append(CollectiveProgress(
            group=getattr(pg, "group_desc", "") or name, rank=c10d.get_rank(pg), world=c10d.get_world_size(pg),
            entered=entered, op=op if seq == entered else "", nbytes=size if seq == entered else 0,
            entered_at=_since(("entered", name), entered, now), left=max(0, completed) if nccl else None,
            left_at=_since(("left", name), completed, now) if nccl else 0.0, source="flight_recorder"))
    return out


_op_of: dict[str, tuple[int, str, int]] = {}  # group name -> (seq, op, bytes) of the collective last read


def _read_ops(dump_json, names: set[str]) -> None:
    dump = json.loads(dump_json(includeCollectives=True, onlyActive=True))
    for e in dump.get("entries") or []:
        name, seq = (e.get("process_group") or ["", ""])[0], int(e.get("collective_seq_id") or 0)
        if name in names and not e.get("is_p2p") and seq >= _op_of.get(name, (0, "", 0))[0]:
            size = sum(_numel(s) * DTYPE_BYTES.get(t, 4)
                       for s, t in zip(e.get("input_sizes") or [], e.get("input_dtypes") or [], strict=False))
            _op_of[name] = (seq, str(e.get("profiling_name", "")).rpartition(":")[2], size)


_first_seen: dict[tuple[str, str], tuple[int, float]] = {}  # (what, group) -> (seq, when this process first read it)


def _since(key: tuple[str, str], seq: int, now: float) -> float:
    """When a sequence number was first read: the recorder keeps no wall time per group (to within a heartbeat)."""
    seen = _first_seen.get(key)
    if seen is None or seen[0] != seq:
        _first_seen[key] = seen = (seq, now)
    return seen[1]


def _recording() -> bool:
    try:
        return int(os.environ.get(FR_ENV) or 0) > 0
    except ValueError:
        return False


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def snapshot() -> list[CollectiveProgress]:
    """Every group of this process: our wrappers' where they track it, the Flight Recorder's for others."""
    ours = TRACKER.snapshot()
    try:
        theirs = flight_recorder()
    except Exception as e:  # a private torch API: a change of it must not stop the heartbeat
        log.debug("reading torch's Flight Recorder failed: %r", e)
        theirs = []
    known = {g.group for g in ours}
    return ours + [g for g in theirs if g.group not in known]
