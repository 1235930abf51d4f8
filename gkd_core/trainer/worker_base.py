"""What every Ray actor of a run is: a ``WorkerBase`` with its Reporter (phase changes and
heartbeats), threaded (``max_concurrency``) so that ``cancel`` and ``stacks`` answer while a long
method runs, its cancel flag checked in every loop that could wait (a cancelled method stops at the
next check and raises ``Cancelled``), its faults for the chaos suite, and its process group.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import ray
import torch
import torch.distributed as dist

from gkd_core.errors import GkdError
from gkd_core.node.stacks import install_faulthandler
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.collectives import TRACKER
from gkd_core.telemetry.ingest import IngestRoute
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer.faults import WorkerFaults

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level

SYNC_GROUP = "weight_sync"  # the process group of the student and the rollouts, as the run names it


def _leak(mb_per_s: float, seconds: float) -> None:
    """The ``grow_memory`` fault: memory that is written (so it is resident, charged to the cgroup) and kept, a tenth
    of a second's worth at a time, for ``seconds`` (0: until the process ends), then let go."""
    kept: list[bytearray] = []
    chunk = max(1, int(mb_per_s * (1 << 20) / 10))
    end = time.monotonic() + seconds if seconds else float("inf")
    while time.monotonic() < end:
        kept.append(bytearray(b"\x01") * chunk)
        time.sleep(0.1)
    kept.clear()


class Cancelled(GkdError, RuntimeError):
    """The method saw its cancel flag."""


class NonFiniteWeights(GkdError, RuntimeError):
    """The student's weights hold NaN or inf: they must not reach the rollout workers."""


@dataclass
class WorkerContext:
    """What every actor needs to report: where, as which run, and its injected faults."""

    ingest: str  # the supervisor's node's address; ``route`` says the way from any node
    run_id: str
    heartbeat_s: float = 1.0
    faults: WorkerFaults = field(default_factory=WorkerFaults)  # only this worker's
    device: str = "cpu"
    stacks_dir: str = ""  # RUN/stacks: where faulthandler writes on SIGUSR1
    route: IngestRoute | None = None
    replaceable: bool = False  # its driver starts it again in its place if it dies (said when it registers)


def interface_of(ip: str) -> str:
    """The name of the network interface that has this IPv4 address, or ""."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            return name
    return ""


def node_id() -> str:
    try:
        return ray.get_runtime_context().get_node_id() or ""
    except Exception as e:  # outside Ray (unit tests)
        log.debug("no Ray node id here: %s", e)
        return ""


def thread_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for tid, frame in sys._current_frames().items():
        out.append(f'Thread {tid:#x} "{names.get(tid, "?")}" (most recent call last):\n'
                   + "".join(traceback.format_stack(frame)))
    return "\n".join(out)


class WorkerBase:
    def __init__(self, src: str, role: str, rank: int, ctx: WorkerContext):
        torch.set_num_threads(1)  # two threads per process oversubscribe a small machine badly
        self.src, self.role, self.rank, self.ctx = src, role, rank, ctx
        self.device = torch.device(ctx.device)
        address, curve = ctx.route.pick(node_id()) if ctx.route else (ctx.ingest, None)
        self.rep = Reporter(src, ingest=address, run=ctx.run_id, heartbeat_s=ctx.heartbeat_s, curve=curve,
                            with_children=True)
        self._cancel = threading.Event()
        self.closers: list = []  # what the worker's own end stops, in order (an engine's stats, then the engine)
        self.gpus: list[int] = []
        try:
            self.gpus = [int(g) for g in ray.get_gpu_ids()]
            actor_id = ray.get_runtime_context().get_actor_id() or ""
        except Exception as e:  # outside Ray (unit tests): no GPUs assigned, no actor id
            log.debug("no Ray actor here: %s", e)
            actor_id = ""
        via = ctx.route.relay_names.get(node_id(), "") if ctx.route else ""
        self.rep.register(role, rank, node=socket.gethostname(), gpus=self.gpus, actor_id=actor_id, via=via,
                          replaceable=ctx.replaceable)
        self.rep.set_phase("init")
        if ctx.stacks_dir:  # the agent's way in when py-spy cannot attach
            install_faulthandler(Path(ctx.stacks_dir))

    # --- control, answered while another method runs ----------------------------------

    def ready(self) -> dict:
        ctx = ray.get_runtime_context()
        return {"src": self.src, "pid": os.getpid(), "node": socket.gethostname(), "gpus": self.gpus,
                "node_id": ctx.get_node_id(), "actor_id": ctx.get_actor_id() or "",
                "ip": ray.util.get_node_ip_address()}

    def cancel(self) -> bool:
        self._cancel.set()
        return True

    def stacks(self) -> str:
        return thread_stacks()

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise Cancelled(f"{self.src}: cancelled")

    def _begin(self) -> None:
        self._cancel.clear()

    # --- faults -------------------------------------------------------------------------

    def _hang(self, what: str, seconds: float) -> None:
        """An injected hang: waits (forever when seconds is 0) until cancelled."""
        self.rep.log(f"fault injected: {what} hangs" + (f" for {seconds:g} s" if seconds else ""), level="warn")
        end = time.monotonic() + seconds if seconds else float("inf")
        while time.monotonic() < end:
            self._check_cancel()
            time.sleep(0.05)

    def _armed_point(self, step: int) -> None:
        """A point where a fault armed while the run goes on may strike (the random trials'): claimed as this step's.
        Memory growth starts here, whichever point claimed it."""
        self.ctx.faults.claim_armed(self.src, step, lambda m: self.rep.log(m, level="warn"))
        f = self.ctx.faults.take("grow_memory", step)
        if f:
            self.rep.log(f"fault injected: {self.src}'s memory grows {f.mb_per_s:g} MB/s"
                         + (f" for {f.seconds:g} s" if f.seconds else "") + " (a leak)", level="warn")
            threading.Thread(target=_leak, args=(f.mb_per_s, f.seconds), name="fault-leak", daemon=True).start()

    def _maybe_faults(self, step: int, where: str) -> None:
        self._armed_point(step)
        f = self.ctx.faults.take("kill_worker", step)
        if f:
            self.rep.log(f"fault injected: {self.src} exits during {where} at step {step}", level="warn")
            self.rep.close(0.5)
            os._exit(1)
        f = self.ctx.faults.take("oom", step)
        if f:  # what torch raises when an allocation does not fit, as a real OOM would
            self.rep.log(f"fault injected: an allocation too large in {where} at step {step}", level="warn")
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 20.00 GiB (fault injected "
                                              f"in {self.src}'s {where} at step {step})")
        f = self.ctx.faults.take("hold_gil", step)
        if f:
            self.rep.log(f"fault injected: holding the GIL for {f.seconds:g} s", level="warn")
            # PyDLL keeps the GIL across the call: the whole process, its Reporter too, stops
            ctypes.PyDLL(None).sleep(int(max(1, f.seconds)))

    # --- the collective group ------------------------------------------------------------

    def init_group(self, rendezvous: str, world: int, rank: int, timeout_s: float, backend: str) -> bool:
        """Join the collective group at ``rendezvous``: ``file://PATH`` on one node, ``tcp://HOST:PORT``
        (served by rank 0) across nodes."""
        with self.rep.phase("join_group", timeout_s=timeout_s, detail=f"rank {rank}/{world} at {rendezvous}"):
            if dist.is_initialized():
                dist.destroy_process_group()
            if backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
                # gloo's pairs listen on the address the host name resolves to, which may be a loopback
                # one (two Ray nodes on one host name, or an /etc/hosts that says 127.0.1.1) or a public
                # one on a single node: on one node, loopback; across nodes, the interface of Ray's own
                # address for this node, which reaches the others
                ip = "127.0.0.1" if rendezvous.startswith("file://") else ray.util.get_node_ip_address()
                ifname = interface_of(ip)
                if ifname:
                    os.environ["GLOO_SOCKET_IFNAME"] = ifname
            dist.init_process_group(backend=backend, init_method=rendezvous, world_size=world,
                                    rank=rank, timeout=timedelta(seconds=timeout_s))
            TRACKER.joined(SYNC_GROUP, rank, world)
        return True

    @contextlib.contextmanager
    def _sync_part(self, sync_id: int, part: str, step: int, delay_inside: bool = False) -> Iterator[float]:
        """One part of a sync (vocab.SYNC_PARTS), said as it begins and as it ends. The ``slow_sync_part``
        fault of this member, step and part makes it longer: here, or (``delay_inside``) where the body puts
        the seconds it is given (a vLLM engine's load: inside the engine's own workers)."""
        began = time.time()
        self.rep.emit(ev.SyncPartEvent(sync_id=sync_id, part=part, step=step, started=began))
        slow = self.ctx.faults.take("slow_sync_part", step, part)
        if slow:
            self.rep.log(f"fault injected: {self.src} takes {slow.seconds:g} s longer in the {part} part of "
                         f"sync {sync_id} (step {step})", level="warn")
        try:
            if slow and not delay_inside:
                time.sleep(slow.seconds)
            yield slow.seconds if slow and delay_inside else 0.0
        finally:
            self.rep.emit(ev.SyncPartEvent(sync_id=sync_id, part=part, state="ended", step=step, started=began))

    def _broadcast(self, vec: torch.Tensor, timeout_s: float, step: int) -> None:
        """The sync's broadcast, said to the run: entered, then left (collectives: who has not joined)."""
        seq = TRACKER.enter(SYNC_GROUP, "broadcast", vec.numel() * vec.element_size())
        work = dist.broadcast(vec, src=0, async_op=True)
        if self.ctx.faults.take("stop_in_sync", step):
            self.rep.log(f"fault injected: {self.src} stops itself (SIGSTOP) inside broadcast #{seq}", level="warn")
            # its word that it entered leaves first (under load a fixed pause was not always enough, and the
            # rank was then called one that had not joined), then ZeroMQ's own thread a moment to send it
            if not self.rep.flush(10.0):
                self.rep.log(f"{self.src}: its events did not leave within 10 s; it stops anyway", level="warn")
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGSTOP)
        self._wait_work(work, timeout_s)
        TRACKER.leave(SYNC_GROUP, seq)

    def _wait_work(self, work, timeout_s: float) -> None:
        """Wait for a collective, checking the cancel flag: a cancelled sync leaves the call at
        once (the group is then torn down and made anew) instead of sitting in C until the timeout."""
        end = time.monotonic() + timeout_s
        while not work.is_completed():
            self._check_cancel()
            if time.monotonic() > end:
                raise TimeoutError(f"{self.src}: collective not complete within {timeout_s:g} s")
            time.sleep(0.005)
        work.wait()  # raises the collective's own error, if it failed

    def destroy_group(self) -> bool:
        TRACKER.left_group(SYNC_GROUP)
        if dist.is_initialized():
            dist.destroy_process_group()
        return True

    def shutdown(self) -> bool:
        for close in self.closers:
            close()
        self.rep.set_phase("finished")
        self.rep.close(1.0)
        return True
