"""The run's Ray cluster: ray.init, the actors (student, rollouts, teacher proxy and workers), the
node agents, Ray's own view of them, the collective group, and every wait on them.

Every wait is ``wait(refs, timeout, phase)``: one deadline for all the named refs, the driver's
commands served while it waits (``on_tick``), and an error that names who is late or who died.
"""

from __future__ import annotations

import faulthandler
import functools
import ipaddress
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import ray
from ray.exceptions import RayActorError, RayError

from gkd_core.config import Config
from gkd_core.lifeline import pass_sigterm_to_group
from gkd_core.node.agent import start_agents
from gkd_core.node.ray_watch import RayWatcher
from gkd_core.rundir import socket_dir
from gkd_core.telemetry import ingest
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer import workers
from gkd_core.trainer.faults import FaultPlan, WorkerFaults
from gkd_core.trainer.guarded import EXIT_STUCK, guarded_wait, watchdog
from gkd_core.trainer.sync_group import SyncGroup
from gkd_core.trainer.worker_base import WorkerContext
from gkd_core.vocab import WorkerId, src_of

log = logging.getLogger(__name__)  # what a broad except let go, said at debug level

# one torch thread per process (more than the cores make small models many times slower), and
# no progress bars or advice from transformers in the logs people read when a run is stuck
QUIET_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
             "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
RAY_INIT_HINT = ("check that the cluster is up (`ray status` on its head), that this node reaches it, and that "
                 "RAY_AUTH_TOKEN is the cluster's; if it is only slow, raise trainer.init_timeout_s")
CLOSE_S = 15.0  # the workers' own end at a finished run (a vLLM engine takes up to 5 s to stop)
PROBE_S = 2.0  # how often an actor that may be started again is asked whether it lives (``dead``)
ACTOR_OPTS = {"num_cpus": 0, "max_concurrency": 4}  # threaded: cancel and stacks answer during a long call


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def init_ray(cfg: Config) -> None:
    """``ray.init``: a new local cluster, or the one RAY_ADDRESS names."""
    # A local raylet starts one idle worker per CPU for the first driver. Every process of ours is an actor
    # with a worker of its own, so those sit idle, and their starts take the cores the actors' imports need
    # (compare: `RAY_prestart_worker_first_driver=1 python bench/bench_launch.py` against it unset).
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    # the state API the Ray watcher reads is served by Ray's dashboard process (127.0.0.1, token-protected):
    # about a second more at start, so only when the watcher is on
    ray.init(include_dashboard=cfg.agent.ray_poll_s > 0, log_to_driver=True,
             logging_level="WARNING",  # type: ignore[arg-type]  # (Ray types it int; it takes a level's name too)
             runtime_env={"env_vars": {**{k: os.environ[k] for k in QUIET_ENV}, **cfg.trainer.env}})
    if threading.current_thread() is threading.main_thread():
        pass_sigterm_to_group()  # a supervisor killed -9 takes Ray's head processes with it


def give_up(rep: Reporter, why: str) -> None:
    """A call with no deadline of its own (Ray's start) ran past ours (``watchdog``). It cannot be interrupted,
    so: say what and where, show where every thread is, and end the driver with EXIT_STUCK —
    the supervisor records the exit and ``restart`` starts over."""
    print("gkd driver: where every thread was when the deadline passed:", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    print(f"gkd driver: {why}", file=sys.stderr, flush=True)  # last: the line the failure alert quotes
    rep.log(why, level="error")
    rep.set_phase("failed", detail=why[:300])
    rep.close(2.0)
    os._exit(EXIT_STUCK)


class Cluster:
    def __init__(self, cfg: Config, run_dir: Path, rep: Reporter, faults: FaultPlan, device: str):
        self.cfg, self.run_dir, self.rep, self.faults, self.device = cfg, run_dir, rep, faults, device
        self.gpus_per_actor = 1 if device == "cuda" else 0
        # Ray's actor handles, typed Any: Ray types a handle's methods as Never (its typed API is ActorProxy's)
        self.actors: dict[str, Any] = {}
        self.info: dict[str, dict] = {}  # src -> pid, node, gpus, node_id, actor_id
        self.agents: dict[str, Any] = {}  # Ray node id -> its node agent
        self.node_labels: dict[str, str] = {}
        self.teacher_address = cfg.teacher.address
        self.teacher_backend = ""
        self.on_tick: Callable[..., None] | None = None  # called about every 100 ms while waiting
        self.route = ingest.IngestRoute(local=rep.ingest)
        self.multi_node = False
        self._probes: dict[str, ray.ObjectRef] = {}  # actor -> its unanswered ``ready`` (``dead``)
        self._probed: dict[str, float] = {}
        self.group: SyncGroup | None = None  # the student's and the rollouts' collective group, once started

    @property
    def members(self) -> list[str]:
        """The collective group: the student is rank 0, rollout i is rank i+1."""
        return ["student/0"] + [src_of("rollout", i) for i in range(self.cfg.rollout.n_workers)]

    def describe(self, src: str) -> str:
        i = self.info.get(src, {})
        gpus = ",".join(map(str, i.get("gpus") or [])) or "-"
        return f"pid {i.get('pid', '?')} on {i.get('node', '?')}, GPU {gpus}"

    def wait(self, refs: dict, timeout_s: float, phase: str, hint: str = "", on_tick=None) -> dict:
        return guarded_wait(refs, timeout_s, phase=phase, describe=self.describe, on_tick=on_tick or self.on_tick,
                            hint=hint)

    def context(self, src: str, again: bool = False) -> WorkerContext:
        """A worker's: ``again``, one started in the place of one that died, gets no injected faults (they fired
        in the one before). The teacher's actors are always started again when they die, the rollouts when
        ``trainer.replace_rollouts`` says so (``replacing``): said as they register."""
        role = WorkerId.parse(src).role
        return WorkerContext(ingest=self.rep.ingest, run_id=self.rep.run,
                             heartbeat_s=self.cfg.telemetry.heartbeat_s, device=self.device,
                             faults=WorkerFaults() if again else self.faults.for_worker(src, self.run_dir),
                             stacks_dir=str(self.run_dir / "stacks"), route=self.route,
                             replaceable=role == "teacher" or (role == "rollout" and self.cfg.trainer.replace_rollouts))

    # --- start ---------------------------------------------------------------------------

    def connect(self) -> None:
        """Ray, and a node agent on each of its nodes: what the workers need before they start."""
        cfg = self.cfg
        where = os.environ.get("RAY_ADDRESS") or "a new local cluster"
        limit, end = cfg.trainer.init_timeout_s, functools.partial(give_up, self.rep)
        with self.rep.phase("init", timeout_s=limit, detail=f"ray.init ({where})"):
            with watchdog(f"ray.init ({where})", limit, end, hint=RAY_INIT_HINT):
                init_ray(cfg)
            with watchdog(f"the Ray GCS ({where}) listing its nodes", limit, end, hint=RAY_INIT_HINT):
                self.route.head_node = ray.get_runtime_context().get_node_id()
                self.multi_node = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
        if self.multi_node:
            self.open_remote_ingest()
        if cfg.agent.enabled:
            self.start_agents()  # first: the workers push their events through their node's agent

    def start_workers(self, cfg: Config) -> None:
        """The student, the rollouts and the teacher, with ``cfg`` (the models' folders resolved by the data's
        loading, which ran beside ``connect``), and their collective group."""
        self.cfg = cfg
        cfg_dict = msgspec.to_builtins(cfg)
        gpu = self.gpus_per_actor
        with self.rep.phase("init", detail="actors"):
            student = ray.remote(workers.StudentActor).options(num_gpus=gpu, **self.opts("student"))
            self.actors["student/0"] = student.remote(self.context("student/0"), cfg_dict)
            for i in range(cfg.rollout.n_workers):
                self.start_rollout(i)
            if cfg.teacher.launch:
                self.start_teacher()
            self.info.update(self.wait({n: a.ready.remote() for n, a in self.actors.items()},
                                       cfg.trainer.init_timeout_s, "init",
                                       hint="check RUN/logs/driver.log for an import or memory error"))
        if cfg.agent.ray_poll_s > 0:
            # Ray's own view of every worker's actor: alive or dead, which method since when
            RayWatcher(self.rep.emit, self.actor_names, interval_s=cfg.agent.ray_poll_s).start()
        self.group = SyncGroup({m: self.actors[m] for m in self.members}, backend="nccl" if self.device == "cuda"
                               else "gloo", store_dir=None if self.multi_node else socket_dir(self.run_dir),
                               student_ip=self.info["student/0"].get("ip", ""), wait=self.wait, reporter=self.rep,
                               init_timeout_s=cfg.trainer.init_timeout_s, sync_timeout_s=cfg.trainer.sync_timeout_s)
        self.group.make()

    def start_rollout(self, rank: int, again: bool = False) -> None:
        """Rollout worker ``rank``'s actor (``again``: in the place of one that died), not waited for."""
        actor = ray.remote(workers.RolloutWorker).options(num_gpus=self.gpus_per_actor, **self.opts("rollout"))
        src = src_of("rollout", rank)
        self.actors[src] = actor.remote(rank, self.context(src, again), msgspec.to_builtins(self.cfg))

    def opts(self, role: str) -> dict:
        """Ray options of a role's actors: threaded, no CPU reserved, its resources from trainer.placement."""
        resources = self.cfg.trainer.placement.get(role)
        return {**ACTOR_OPTS, "resources": dict(resources)} if resources else dict(ACTOR_OPTS)

    @property
    def bind_host(self) -> str:
        """Where this node listens for the others: ``telemetry.bind_host``, or Ray's address for this
        node when that is a loopback address and the cluster has other nodes (they cannot reach it)."""
        host = self.cfg.telemetry.bind_host
        return ray.util.get_node_ip_address() if self.multi_node and _loopback(host) else host

    @property
    def teacher_host(self) -> str:
        """Where the teacher proxy listens: as ``bind_host``, but on its own node's Ray address
        (empty: the proxy finds it), which need not be the head's."""
        host = self.cfg.telemetry.bind_host
        return "" if self.multi_node and _loopback(host) else host

    def open_remote_ingest(self) -> None:
        """Ask the supervisor for a CurveZMQ tcp ingest on the head node's address, for the workers
        on other nodes, and hand them the run's keys through Ray (``self.route``)."""
        with self.rep.phase("init", detail="the ingest for other nodes"):
            try:
                endpoint, curve = ingest.open_remote(os.environ.get("GKD_CONTROL", ""), self.bind_host,
                                                     self.run_dir / "keys")
            except Exception as e:
                self.rep.log(f"the supervisor did not open an ingest for other nodes ({e}); their workers' "
                             "events will be missing", level="error")
                return
        self.route.remote, self.route.curve = endpoint, curve
        self.rep.log(f"workers on other nodes push events to {endpoint} (CurveZMQ, this run's keys)")

    def actor_names(self) -> dict[str, str]:
        """actor id -> worker, for the Ray watcher's thread (a copy: the main thread adds workers)."""
        return {i["actor_id"]: src for src, i in list(self.info.items()) if i.get("actor_id")}

    def start_agents(self) -> None:
        """One node agent per Ray node. A run without agents still runs: stacks then come from the
        workers themselves, and the GPU pane says there are no readings."""
        a = self.cfg.agent
        ready: dict[str, dict] = {}
        with self.rep.phase("init", detail="node agents"):
            try:
                self.agents, self.node_labels = start_agents(
                    self.route, self.rep.run, self.run_dir, gpu_backend=self.faults.gpu_backend(a.gpu_backend),
                    gpu_interval_s=a.gpu_interval_s, nvml_deadline_s=a.nvml_deadline_s,
                    heartbeat_s=self.cfg.telemetry.heartbeat_s, ready=ready)
            except Exception as e:  # never the reason a run does not start
                self.rep.log(f"node agents did not start ({type(e).__name__}: {e}); stacks come from the workers "
                             "alone", level="warn")
                return
        # a relay is the same path on its node for every agent of the run: one started again binds it
        # again, and the workers' sockets find it by themselves
        for node_id, answer in ready.items():
            if answer.get("relay"):
                self.route.relays[node_id] = answer["relay"]
                self.route.relay_names[node_id] = src_of("agent", self.node_labels[node_id])
        missing = [label for node, label in self.node_labels.items() if node not in self.agents]
        if missing:
            self.rep.log(f"no node agent on {', '.join(missing)} within the deadline", level="warn")

    def start_teacher(self) -> None:
        """The teacher proxy (once, or again after it died) and its workers (those not running). The workers
        start beside a new proxy, not after it: each loads its model while the proxy's process starts (the
        proxy's start-up was added to the teacher's, before the first step), and is handed the proxy's
        backend address to come."""
        t = self.cfg.teacher
        backend: str | list[ray.ObjectRef] = self.teacher_backend
        addresses = None
        if "teacher/proxy" not in self.actors:
            proxy: Any = ray.remote(workers.TeacherProxyActor).options(**self.opts("teacher")).remote(
                self.context("teacher/proxy"), self.teacher_host)
            self.actors["teacher/proxy"] = proxy
            addresses = proxy.addresses.remote()
            backend = [addresses]  # in a list: Ray hands the worker the reference, not a wait before it starts
        worker = ray.remote(workers.TeacherWorkerActor).options(num_gpus=self.gpus_per_actor, **self.opts("teacher"))
        for i in range(t.n_server_workers):
            if src_of("teacher", i) in self.actors:
                continue
            self.actors[src_of("teacher", i)] = worker.remote(i, self.context(src_of("teacher", i)), t.path,
                                                        backend, t.trust_remote_code, t.engine, t.topk,
                                                        self.cfg.trainer.init_timeout_s)
        if addresses is not None:
            addrs = self.wait({"teacher/proxy": addresses}, self.cfg.trainer.init_timeout_s, "init")["teacher/proxy"]
            self.teacher_backend = addrs["backend"]
            self.teacher_address = t.address or addrs["frontend"]  # a teacher of one's own wins

    def dead(self, handles: dict[str, Any]) -> list[str]:
        """The names among ``handles`` whose actors Ray reports dead. Never blocks: each is asked
        ``ready`` at most every ``PROBE_S``, and one that has not answered yet (busy, or frozen:
        the alerts name it) is not dead."""
        now = time.monotonic()
        for n, h in handles.items():
            if n not in self._probes and now - self._probed.get(n, 0.0) >= PROBE_S:
                self._probes[n], self._probed[n] = h.ready.remote(), now
        asked = {ref: n for n, ref in self._probes.items() if n in handles}
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=0) if asked else ([], [])
        dead = []
        for ref in answered:
            n = asked[ref]
            del self._probes[n]
            try:
                ray.get(ref, timeout=1)
            except RayActorError:
                dead.append(n)
            except RayError:  # it answered, with an error: alive, and not for this probe to judge
                pass
        return dead

    def forget_probe(self, name: str) -> None:
        """``name``'s unanswered probe, dropped: its actor is replaced (the new one is asked anew)."""
        self._probes.pop(name, None)

    def dead_teacher(self) -> list[str]:
        """The launched teacher's actors that Ray reports dead (``dead``)."""
        if not self.cfg.teacher.launch or "teacher/proxy" not in self.actors:
            return []
        return self.dead({n: self.actors[n] for n in ["teacher/proxy", *self.teacher_workers()]})

    def teacher_workers(self) -> list[str]:
        return [n for n in self.actors if n.startswith("teacher/") and n != "teacher/proxy"]

    # --- end -----------------------------------------------------------------------------

    def close_workers(self, timeout_s: float = CLOSE_S) -> dict[str, str]:
        """Each worker's own end, at a run that finished: engines stopped, the last counts sent (the teacher
        proxy's), its reporter flushed. The workers that did not close, and why."""
        refs = {a.shutdown.remote(): name for name, a in self.actors.items()}
        try:
            done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        except Exception as e:
            return {name: f"could not be asked: {type(e).__name__}: {e}"[:200] for name in refs.values()}
        why = {name: f"no answer within {timeout_s:g} s" for ref, name in refs.items() if ref not in done}
        for ref in done:
            try:
                ray.get(ref, timeout=0)
            except Exception as e:  # its engine would not stop, say: said, and the run still ends
                why[refs[ref]] = f"failed: {type(e).__name__}: {e}"[:200]
        return dict(sorted(why.items()))

    def shutdown(self) -> None:
        if self.group is not None:
            self.group.forget_file()
        if self.agents:  # their relays send what they hold and remove their sockets
            try:
                ray.wait([a.stop.remote() for a in self.agents.values()], num_returns=len(self.agents), timeout=3.0)
            except Exception as e:  # the run ends either way: what went wrong is said, not raised
                log.debug("the node agents did not stop: %s", e)

        def stop() -> None:
            try:
                ray.shutdown()
            except Exception as e:  # (in a thread of its own, joined for 15 s)
                log.debug("ray.shutdown failed: %s", e)

        t = threading.Thread(target=stop, daemon=True)
        t.start()
        t.join(15)  # ray.shutdown is a wait too
