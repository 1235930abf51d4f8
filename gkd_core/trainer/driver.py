"""The GKD driver: the training loop on Ray, run by the supervisor as its child.

``python -m gkd_core.trainer.driver --config RUN/restarts/NNN.yaml --run-dir RUN``

Student generates (rollout workers), the teacher returns top-k log-probs for the student's
tokens, the student trains on a divergence against them, the weights go back to the rollout
workers over a collective group. Every wait is a ``guarded_wait`` with a deadline and a name;
every phase is reported; commands forwarded by the supervisor (cancel, dump_stacks) are served
while waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from gkd_core import config as config_mod
from gkd_core.lifeline import die_with_supervisor
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.commands import CommandInbox
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer import checkpoints
from gkd_core.units import size

EXIT_CONFIG = 2
# one torch thread per process (more than the cores make small models many times slower), and
# no progress bars or advice from transformers in the logs people read when a run is stuck
QUIET_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_VERBOSITY": "error",
             "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
EXIT_STUCK = 3  # a wait ran past its deadline, or a worker died: the error says who
STACK_DEADLINE_S = 3.0


class SyncCancelled(RuntimeError):
    pass


class BadSteps(RuntimeError):
    """Steps in a row whose loss or gradient was not finite: the run stops instead of training on."""


@dataclass
class Pending:
    """Prompts out for generation: the Ray calls and how their rows are padded."""

    refs: dict
    left_pad: np.ndarray  # [B], in the order the rollouts' parts come back
    width: int  # the prompts' padded width: every completion starts there
    position: int  # the data position once these prompts are taken


@dataclass
class Batch:
    seqs: np.ndarray  # [B, width + new]
    left_pad: np.ndarray
    width: int
    position: int
    gen_s: float  # the slowest rollout's generation time


def stragglers(pending: list[str]) -> list[str]:
    """The root's broadcast completes only when every receiver has taken its part, so a pending
    student is blocked by pending rollouts: they are the ones to name."""
    return [m for m in pending if m != "student/0"] or pending


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def latest_checkpoint(run_dir: Path) -> Path | None:
    return checkpoints.latest(run_dir / "checkpoints")


def best_stack(cap, own: tuple[str, str] | None) -> tuple[str, str, str]:
    """(text, method, note) of one target: the agent's capture (a Capture) when it read something,
    else what the worker's own thread said, else every reason why neither could."""
    if cap is not None and cap.text:
        return cap.text, cap.method, cap.error
    if own is not None and own[0]:
        return own[0], "in-process", cap.error if cap is not None else ""
    reasons = [r for r in (cap.error if cap is not None else "", own[1] if own else "") if r]
    return "", "", "; ".join(reasons)


class Driver:
    def __init__(self, cfg: config_mod.Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        self.restart = int(os.environ.get("GKD_RESTART", "0"))
        self.rep = Reporter("driver", heartbeat_s=cfg.telemetry.heartbeat_s)
        self.inbox = CommandInbox()
        self.rep.register("driver", 0, node=socket.gethostname())
        self.actors: dict[str, object] = {}
        self.info: dict[str, dict] = {}
        self.sync_id = 0
        self._cancel_sync = False
        # faults fire in the first incarnation only: a restart is how you get past them
        self.faults = [msgspec.to_builtins(f) for f in cfg.faults] if self.restart == 0 else []
        self.agents: dict[str, object] = {}  # Ray node id -> its node agent
        self.node_labels: dict[str, str] = {}
        self._teacher_back_at: float | None = None
        self.bad_steps = 0
        self._bad_run: list[int] = []  # the current run of skipped steps
        self._last_ckpt_bytes = 0  # the last checkpoint's size (an estimate until this driver has saved one)
        self._disk_low = self.restart > 0  # a restarted driver clears what its predecessor raised, at its first save
        self.consumed = 0  # the data position after the last trained step's prompts (kept in checkpoints)
        self.last_eval: dict = {}

    # --- reporting helpers -------------------------------------------------------------

    def describe(self, src: str) -> str:
        i = self.info.get(src, {})
        gpus = ",".join(map(str, i.get("gpus") or [])) or "-"
        return f"pid {i.get('pid', '?')} on {i.get('node', '?')}, GPU {gpus}"

    def action(self, op: str, by: str, ok: bool, result) -> None:
        self.rep.emit(ev.ActionEvent(op=op, by=by, ok=ok, result=result))

    # --- commands ------------------------------------------------------------------------

    def serve_commands(self, *_args) -> None:
        for cmd in self.inbox.poll(0):
            try:
                if cmd.op == "dump_stacks":
                    self.dump_stacks(cmd.args.get("targets") or [], cmd.by, str(cmd.args.get("dump_id") or cmd.id))
                elif cmd.op == "cancel":
                    self.cancel(str(cmd.args.get("target") or "sync"), str(cmd.args.get("mode") or "cooperative"),
                                cmd.by)
                else:
                    self.action(cmd.op, cmd.by, False, f"the driver does not know '{cmd.op}'")
            except Exception as e:  # a command must never take the run down
                self.action(cmd.op, cmd.by, False, f"{type(e).__name__}: {e}")

    def dump_stacks(self, targets: list[str], by: str, dump_id: str) -> None:
        """Every target's stack, two ways at once within one deadline: its node's agent (py-spy with
        native frames, or faulthandler: these work while the process holds the GIL or sits in C), and
        the worker's own thread (which needs the GIL). The agent's answer wins when it has one."""
        import ray

        from gkd_core.node.agent import gather_stacks
        from gkd_core.node.stacks import Capture
        from gkd_core.trainer.workers import thread_stacks

        wanted = targets or ["driver", *self.actors]
        folder = self.run_dir / "stacks" / dump_id
        folder.mkdir(parents=True, exist_ok=True)
        refs = {t: self.actors[t].stacks.remote() for t in wanted if t in self.actors}
        own: dict[str, tuple[str, str]] = {}
        if "driver" in wanted:
            own["driver"] = (thread_stacks(), "")
        caps: dict[str, Capture] = {}
        if self.agents:
            here = ray.get_runtime_context().get_node_id()
            where = {t: (self.info[t]["node_id"], self.info[t]["pid"]) for t in wanted
                     if t in self.info and self.info[t].get("node_id")}
            if "driver" in wanted:
                where["driver"] = (here, os.getpid())
            caps = gather_stacks(self.agents, self.node_labels, where, timeout_s=self.cfg.agent.stack_timeout_s)
        if refs:
            # with agents, the workers' threads have had the agents' whole round to answer already
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=0.3 if caps else STACK_DEADLINE_S)
            for t, ref in refs.items():
                if ref in ready:
                    try:
                        own[t] = (ray.get(ref, timeout=1), "")
                    except Exception as e:
                        own[t] = ("", f"{type(e).__name__}: {e}"[:300])
                else:
                    own[t] = ("", f"its own thread did not answer ({self.describe(t)}): it holds the GIL in C "
                                  "or is frozen")
        for t in wanted:
            if t not in caps and t not in own:
                text, method, err = "", "", f"no worker named {t}"
            else:
                text, method, err = best_stack(caps.get(t), own.get(t))
                if not text and not self.agents:
                    err += f"; try `py-spy dump --native --pid {self.info.get(t, {}).get('pid', '?')}` on its node"
            (folder / (t.replace("/", "_") + ".txt")).write_text(text + (f"\n# note: {err}\n" if err else ""))
            self.rep.emit(ev.StackEvent(dump_id=dump_id, target=t, method=method, text=text, error=err))
        self.action("dump_stacks", by, True, {"dump_id": dump_id, "targets": sorted(wanted),
                                              "folder": str(folder.relative_to(self.run_dir))})

    def cancel(self, target: str, mode: str, by: str) -> None:
        import ray

        if target == "sync":
            self._cancel_sync = True
            self.action("cancel", by, True, {"target": "sync", "outcome": "the current sync is being cancelled"})
            return
        names = list(self.actors) if target == "all" else [target]
        missing = [n for n in names if n not in self.actors]
        if missing:
            self.action("cancel", by, False, f"no worker named {', '.join(missing)}; workers: {', '.join(self.actors)}")
            return
        for n in names:
            if mode == "force":
                ray.kill(self.actors[n], no_restart=True)
            else:
                self.actors[n].cancel.remote()
        if target == "all":
            self._cancel_sync = True
        self.action("cancel", by, True, {"target": target, "mode": mode,
                                         "outcome": "killed" if mode == "force" else "cancel flag set"})

    # --- setup -----------------------------------------------------------------------------

    def wait(self, refs: dict, timeout_s: float, phase: str, hint: str = "") -> dict:
        from gkd_core.trainer.guarded import guarded_wait

        return guarded_wait(refs, timeout_s, phase=phase, describe=self.describe, on_tick=self.serve_commands,
                            hint=hint)

    def start(self) -> None:
        import ray
        import torch

        from gkd_core.rundir import gkd_home
        from gkd_core.trainer import data, inputs, workers

        with self.rep.phase("load_data"):
            self.inputs = inputs.prepare(self.cfg, gkd_home(), log=self.rep.log)
        self.cfg = cfg = self.inputs.cfg  # the model folders resolved: workers load exactly these
        self.rep.log(self.inputs.said)
        self.order = data.PromptOrder(len(self.inputs.train.ids), cfg.data.seed)
        device = cfg.trainer.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        with self.rep.phase("init", timeout_s=cfg.trainer.init_timeout_s, detail="ray.init"):
            # the state API the Ray watcher reads is served by Ray's dashboard process (127.0.0.1,
            # token-protected): about a second more at start, so only when the watcher is on
            ray.init(include_dashboard=cfg.agent.ray_poll_s > 0, logging_level="WARNING", log_to_driver=True,
                     runtime_env={"env_vars": {**{k: os.environ[k] for k in QUIET_ENV}, **cfg.trainer.env}})
        self.teacher_path = cfg.teacher.path
        gpu = 1 if device == "cuda" else 0

        def ctx(src: str) -> workers.WorkerContext:
            return workers.WorkerContext(ingest=self.rep.ingest, run_id=self.rep.run,
                                         heartbeat_s=cfg.telemetry.heartbeat_s, device=device,
                                         faults=[f for f in self.faults if f["target"] == src
                                                 or (f["kind"] == "nan_grad" and src == "student/0")],
                                         stacks_dir=str(self.run_dir / "stacks"))

        opts = {"num_cpus": 0, "max_concurrency": 4}
        cfg_dict = msgspec.to_builtins(cfg)
        with self.rep.phase("init", detail="actors"):
            Student = ray.remote(workers.StudentActor).options(num_gpus=gpu, **opts)
            Rollout = ray.remote(workers.RolloutWorker).options(num_gpus=gpu, **opts)
            self.actors["student/0"] = Student.remote(ctx("student/0"), cfg_dict)
            for i in range(cfg.rollout.n_workers):
                self.actors[f"rollout/{i}"] = Rollout.remote(i, ctx(f"rollout/{i}"), cfg_dict)
            if cfg.teacher.launch:
                self.start_teacher()
            self.info.update(self.wait({n: a.ready.remote() for n, a in self.actors.items()},
                                       cfg.trainer.init_timeout_s, "init",
                                       hint="check RUN/logs/driver.log for an import or memory error"))
        if cfg.agent.enabled:
            self.start_agents()
        if cfg.agent.ray_poll_s > 0:
            from gkd_core.node.ray_watch import RayWatcher

            # Ray's own view of every worker's actor: alive or dead, which method since when
            RayWatcher(self.rep.emit, self.actor_names, interval_s=cfg.agent.ray_poll_s).start()
        from gkd_core.teacher.client import TeacherClient

        address = cfg.teacher.address or self.teacher_address
        self.teacher = TeacherClient(address, num_microbatches=cfg.teacher.num_microbatches,
                                     max_in_flight=cfg.teacher.max_in_flight, timeout_s=cfg.teacher.request_timeout_s,
                                     max_retries=cfg.teacher.max_retries, reporter=self.rep)
        self.make_group()

    def actor_names(self) -> dict[str, str]:
        """actor id -> worker, for the Ray watcher's thread (a copy: the main thread adds workers)."""
        return {i["actor_id"]: src for src, i in list(self.info.items()) if i.get("actor_id")}

    def start_agents(self) -> None:
        """One node agent per Ray node. A run without agents still runs: stacks then come from the
        workers themselves, and the GPU pane says there are no readings."""
        from gkd_core.node.agent import start_agents

        a = self.cfg.agent
        backend = a.gpu_backend
        for f in self.faults:
            if f["kind"] == "hang_nvml":  # the test backend, hanging on that sample
                backend = f"fake:gpus=1,hang_at={f['step']}"
        with self.rep.phase("init", detail="node agents"):
            try:
                self.agents, self.node_labels = start_agents(
                    self.rep.ingest, self.rep.run, self.run_dir, gpu_backend=backend, gpu_interval_s=a.gpu_interval_s,
                    nvml_deadline_s=a.nvml_deadline_s, heartbeat_s=self.cfg.telemetry.heartbeat_s)
            except Exception as e:  # never the reason a run does not start
                self.rep.log(f"node agents did not start ({type(e).__name__}: {e}); stacks come from the workers "
                             "alone", level="warn")
                return
        missing = [label for node, label in self.node_labels.items() if node not in self.agents]
        if missing:
            self.rep.log(f"no node agent on {', '.join(missing)} within the deadline", level="warn")

    def start_teacher(self) -> None:
        import ray

        from gkd_core.trainer import workers

        opts = {"num_cpus": 0, "max_concurrency": 4}
        gpu = 1 if self.device == "cuda" else 0

        def ctx(src: str) -> workers.WorkerContext:
            return workers.WorkerContext(ingest=self.rep.ingest, run_id=self.rep.run,
                                         heartbeat_s=self.cfg.telemetry.heartbeat_s, device=self.device)

        if "teacher/proxy" not in self.actors:
            proxy = ray.remote(workers.TeacherProxyActor).options(**opts).remote(ctx("teacher/proxy"),
                                                                                   self.cfg.telemetry.bind_host)
            self.actors["teacher/proxy"] = proxy
            addrs = self.wait({"teacher/proxy": proxy.addresses.remote()}, self.cfg.trainer.init_timeout_s,
                              "init")["teacher/proxy"]
            self.teacher_address, self.teacher_backend = addrs["frontend"], addrs["backend"]
        Worker = ray.remote(workers.TeacherWorkerActor).options(num_gpus=gpu, **opts)
        for i in range(self.cfg.teacher.n_server_workers):
            self.actors[f"teacher/{i}"] = Worker.remote(i, ctx(f"teacher/{i}"), self.teacher_path, self.teacher_backend,
                                                        self.cfg.teacher.trust_remote_code)

    def make_group(self) -> None:
        """(Re)create the collective group: the student is rank 0, rollout i is rank i+1."""
        import ray

        members = ["student/0"] + [f"rollout/{i}" for i in range(self.cfg.rollout.n_workers)]
        backend = "nccl" if self.device == "cuda" else "gloo"
        address = "127.0.0.1" if len(ray.nodes()) == 1 else ray.util.get_node_ip_address()
        port = free_port()
        refs = {m: self.actors[m].init_group.remote(address, port, len(members), r, self.cfg.trainer.sync_timeout_s,
                                                    backend) for r, m in enumerate(members)}
        with self.rep.phase("join_group", timeout_s=self.cfg.trainer.init_timeout_s, detail=f"{backend} {port}"):
            self.wait(refs, self.cfg.trainer.init_timeout_s, "join_group",
                      hint="a member that never joins is stuck before init: dump its stack (d)")

    # --- one step's parts ------------------------------------------------------------------

    def launch_generate(self, step: int) -> Pending:
        """The next batch of prompts, out to the rollouts."""
        rows = [self.inputs.train.ids[i] for i in self.order.take(self.cfg.data.batch_size)]
        return self._send(rows, step, seed=self.cfg.data.seed * 100_003 + step * 31, greedy=False)

    def _send(self, rows: list[list[int]], step: int, seed: int, greedy: bool) -> Pending:
        from gkd_core.trainer import data

        ids, pads = data.left_pad(rows, self.inputs.pad_id)
        n = self.cfg.rollout.n_workers
        parts = np.array_split(np.arange(len(ids)), n)
        refs = {f"rollout/{i}": self.actors[f"rollout/{i}"].generate.remote(ids[idx], pads[idx], step, seed + i, greedy)
                for i, idx in enumerate(parts) if len(idx)}
        return Pending(refs, pads, ids.shape[1], self.order.position)

    def collect_generate(self, pending: Pending, step: int, what: str = "generate") -> Batch:
        out = self.wait(pending.refs, self.cfg.trainer.step_timeout_s, what,
                        hint="dump the rollout's stack (d); restart smaller (r) if it is out of memory")
        seqs = [out[k][0] for k in sorted(out, key=lambda s: int(s.split("/")[1]))]
        width = max(s.shape[1] for s in seqs)
        batch = np.concatenate([np.pad(s, ((0, 0), (0, width - s.shape[1])), constant_values=self.inputs.pad_id)
                                for s in seqs])
        return Batch(batch, pending.left_pad, pending.width, pending.position, max(out[k][1] for k in out))

    def evaluate(self, step: int) -> None:
        """The held-out prompts, completed greedily by the rollouts (which hold the newest weights),
        scored by the teacher and measured by the student."""
        if not self.inputs.val:
            return
        with self.rep.phase("evaluate", step=step, detail=f"{len(self.inputs.val)} held-out prompts"):
            batch = self.collect_generate(self._send(self.inputs.val, step, seed=0, greedy=True), step, "evaluate")
            tids, tlps = self.teacher_score(batch, step)
            self.last_eval = self.wait(
                {"student/0": self.actors["student/0"].evaluate.remote(batch.seqs, batch.left_pad, batch.width, tids,
                                                                       tlps, step)},
                self.cfg.trainer.step_timeout_s, "evaluate")["student/0"]

    def eval_due(self, step: int) -> bool:
        every = self.cfg.trainer.eval_every
        return step == self.cfg.trainer.total_steps or (every > 0 and step % every == 0)

    def teacher_score(self, batch: Batch, step: int) -> tuple[np.ndarray, np.ndarray]:
        from gkd_core.teacher.client import TeacherUnavailable

        deadline = time.monotonic() + self.cfg.trainer.step_timeout_s
        while True:
            self.maybe_teacher_back()
            try:
                return self.teacher.score(batch.seqs, self.cfg.teacher.topk, on_wait=self.on_teacher_wait,
                                          left_pad=batch.left_pad)
            except TeacherUnavailable as e:
                if time.monotonic() > deadline:
                    raise
                self.rep.log(f"step {step}: {e}; retrying the step's teacher scoring", level="error")
                self.rep.set_phase("teacher_wait", step=step, detail=f"teacher unavailable, retrying: {e}"[:300])

    def on_teacher_wait(self) -> None:
        self.maybe_teacher_back()
        self.serve_commands()

    def maybe_teacher_back(self) -> None:
        if self._teacher_back_at is not None and time.monotonic() >= self._teacher_back_at:
            self._teacher_back_at = None
            self.rep.log("fault: bringing the teacher workers back", level="warn")
            self.start_teacher()

    def apply_driver_faults(self, step: int) -> None:
        import ray

        for f in self.faults:
            if f["step"] != step:
                continue
            teachers = [n for n in self.actors if n.startswith("teacher/") and n != "teacher/proxy"]
            if f["kind"] == "kill_teacher":
                self.rep.log(f"fault injected: killing {', '.join(teachers)} at step {step}", level="warn")
                for n in teachers:
                    ray.kill(self.actors.pop(n), no_restart=True)
                if f["seconds"]:
                    self._teacher_back_at = time.monotonic() + f["seconds"]
            elif f["kind"] == "delay_teacher":
                self.rep.log(f"fault injected: {', '.join(teachers)} answer {f['seconds']:g} s late from step {step}",
                             level="warn")
                for n in teachers:
                    self.actors[n].set_delay.remote(f["seconds"])
        for f in self.faults:
            if f["kind"] == "delay_teacher" and f["step"] == step - 1:
                for n in self.actors:
                    if n.startswith("teacher/") and n != "teacher/proxy":
                        self.actors[n].set_delay.remote(0.0)

    def sync(self, step: int) -> None:
        from gkd_core.trainer.guarded import WaitTimeout, WorkerFailed

        self.sync_id += 1
        sid = self.sync_id
        timeout = self.cfg.trainer.sync_timeout_s
        members = ["student/0"] + [f"rollout/{i}" for i in range(self.cfg.rollout.n_workers)]
        self._cancel_sync = False
        t0 = time.monotonic()
        self.rep.emit(ev.SyncEvent(sync_id=sid, state="started", timeout_s=timeout, pending=members, step=step))
        refs = {"student/0": self.actors["student/0"].sync_send.remote(sid, step, timeout)}
        for m in members[1:]:
            refs[m] = self.actors[m].sync_rollout_weights.remote(sid, step, timeout)

        def tick(pending: list[str], elapsed: float) -> None:
            self.rep.emit(ev.SyncEvent(sync_id=sid, state="progress", timeout_s=timeout, elapsed_s=elapsed,
                                       pending=stragglers(pending), done=[m for m in members if m not in pending],
                                       step=step))
            self.serve_commands()
            if self._cancel_sync:
                raise SyncCancelled(f"sync {sid} cancelled with {', '.join(pending)} pending")

        from gkd_core.trainer.guarded import guarded_wait

        try:
            prints = guarded_wait(refs, timeout, phase="sync_weights", describe=self.describe, on_tick=tick,
                                  hint="dump their stacks (d); cancel the sync (c) or restart smaller (r)")
        except WaitTimeout as e:
            late = stragglers(e.pending)
            blocked = "student/0" in e.pending and late != e.pending
            done = ", ".join(f"{m} in {t:.1f} s" for m, t in sorted(e.done.items())) or "nobody"
            msg = (f"{', '.join(late)} did not finish sync_weights (sync {sid}, step {step}) within "
                   f"{timeout:g} s: " + "; ".join(f"{m} is {self.describe(m)}" for m in late)
                   + (" ; student/0 is blocked in its broadcast, waiting for them" if blocked else "")
                   + f"; finished: {done}; try: dump their stacks (d), then cancel the sync (c) or restart "
                   "smaller (r)")
            self.rep.emit(ev.SyncEvent(sync_id=sid, state="timed_out", timeout_s=timeout,
                                       elapsed_s=time.monotonic() - t0, pending=late,
                                       done=sorted(e.done), error=msg, step=step))
            for m in e.pending:
                self.actors[m].cancel.remote()
            raise WaitTimeout(msg, late, e.done) from None
        except SyncCancelled as e:
            self.rep.emit(ev.SyncEvent(sync_id=sid, state="cancelled", timeout_s=timeout,
                                       elapsed_s=time.monotonic() - t0, error=str(e), step=step))
            for m in members:
                self.actors[m].cancel.remote()
            self.rebuild_group()
            return self.sync(step)  # the weights still have to reach the rollouts
        except WorkerFailed as e:
            self.rep.emit(ev.SyncEvent(sync_id=sid, state="failed", timeout_s=timeout,
                                       elapsed_s=time.monotonic() - t0, pending=[e.name], error=str(e)[:1000],
                                       step=step))
            raise
        want = prints["student/0"]
        ok = all(prints[m] == want for m in members[1:])
        self.rep.emit(ev.SyncEvent(sync_id=sid, state="done", timeout_s=timeout, elapsed_s=time.monotonic() - t0,
                                   done=members, fingerprint_ok=ok, step=step,
                                   error="" if ok else "rollout weights differ from the student's: "
                                   + ", ".join(m for m in members[1:] if prints[m] != want)))

    def rebuild_group(self) -> None:
        """An aborted sync leaves the group in an unknown state: tear it down and make a new one."""
        members = ["student/0"] + [f"rollout/{i}" for i in range(self.cfg.rollout.n_workers)]
        refs = {m: self.actors[m].destroy_group.remote() for m in members}
        self.wait(refs, self.cfg.trainer.sync_timeout_s, "destroy_group")
        self.make_group()

    def checkpoint(self, step: int) -> None:
        """Save, unless the last checkpoint's size does not fit on the disk: then a `disk_low` alert
        and training goes on without this save. Older checkpoints go once the new one is complete."""
        root = self.run_dir / "checkpoints"
        root.mkdir(parents=True, exist_ok=True)
        ok, free = checkpoints.fits(root, self._last_ckpt_bytes, self.disk_for(step))
        if not ok:
            last = latest_checkpoint(self.run_dir)
            self._disk_low = True
            self.rep.emit(ev.AlertEvent(
                severity="critical", code="disk_low", targets=["checkpoint"],
                message=f"step {step} not saved: {size(free)} free on the run directory's disk, a "
                        f"checkpoint takes {size(self._last_ckpt_bytes)}; training goes on"
                        + (f"; the last one is {last.relative_to(self.run_dir)}" if last else ""),
                hint="free space on that disk or lower trainer.keep_checkpoints; the next save tries again"))
            return
        folder = root / f"step_{step:06d}"
        with self.rep.phase("checkpoint", step=step):
            self.wait({"student/0": self.actors["student/0"].save.remote(str(folder))}, self.cfg.trainer.step_timeout_s,
                      "checkpoint")
            (folder / "state.json").write_text(json.dumps({
                "step": step, "prompts_consumed": self.consumed, "epoch": self.consumed // self.order.n,
                "sync_id": self.sync_id}))
            (folder / "COMPLETE").write_text("")  # written last: a checkpoint without it is ignored
        self._last_ckpt_bytes = checkpoints.size_bytes(folder)
        checkpoints.prune(root, self.cfg.trainer.keep_checkpoints)
        if self._disk_low:
            self._disk_low = False
            self.rep.emit(ev.AlertEvent(severity="critical", code="disk_low", targets=["checkpoint"], cleared=True))

    def disk_for(self, step: int) -> checkpoints.FreeSpace:
        """The free-space reading: the real one, or the `disk_full` fault's empty disk."""
        for f in self.faults:
            if f["kind"] == "disk_full" and f["step"] <= step < f["step"] + max(1, f.get("repeat", 1)):
                return checkpoints.FakeFreeSpace(0)
        return checkpoints.DiskFreeSpace()

    def on_bad_step(self, step: int, m: dict) -> str:
        """A skipped step, counted. After ``max_bad_steps`` in a row the run must stop: the error,
        naming the last good checkpoint and how to go on from it."""
        self.bad_steps += 1 if m.get("skipped") else 0
        self._bad_run.append(step)
        limit = self.cfg.trainer.max_bad_steps
        if len(self._bad_run) < limit and m.get("weights_finite", True):
            return ""
        last = latest_checkpoint(self.run_dir)
        where = f"{last.relative_to(self.run_dir)}" if last else "none yet (a restart begins at step 1)"
        why = (f"{len(self._bad_run)} steps in a row had a non-finite loss or gradient "
               f"(steps {self._bad_run[0]}-{self._bad_run[-1]}, gradient norm {m.get('grad_norm')})"
               if m.get("weights_finite", True) else f"the student's weights are not finite after step {step}")
        return (f"{why}; the rollouts kept the last good weights. Last good checkpoint: {where}. "
                f"Try: gkd-tui restart {self.run_dir} -o actor.lr={self.cfg.actor.lr / 10:g}"
                + ("" if self.cfg.actor.max_grad_norm else " -o actor.max_grad_norm=1.0")
                + (" -o model.dtype=bfloat16" if self.cfg.model.dtype == "float16" else ""))

    # --- the loop ------------------------------------------------------------------------

    def resume(self) -> int:
        ckpt = latest_checkpoint(self.run_dir)
        # what the next save will take, for the free-space check of the first one: the last
        # checkpoint's size, else the student's own estimate (weights and optimizer state)
        self._last_ckpt_bytes = checkpoints.size_bytes(ckpt) if ckpt is not None else self.wait(
            {"student/0": self.actors["student/0"].checkpoint_bytes.remote()}, self.cfg.trainer.init_timeout_s,
            "resume")["student/0"]
        if ckpt is None:
            return 1
        state = json.loads((ckpt / "state.json").read_text())
        self.wait({"student/0": self.actors["student/0"].load.remote(str(ckpt))}, self.cfg.trainer.init_timeout_s,
                  "resume")
        self.sync_id = state.get("sync_id", 0)
        # where the data stands: prompts handed out by the steps saved (older checkpoints: steps x batch)
        self.consumed = self.order.position = int(state.get("prompts_consumed",
                                                            state["step"] * self.cfg.data.batch_size))
        self.rep.log(f"resumed from {ckpt.relative_to(self.run_dir)} (step {state['step']}, prompt "
                     f"{self.consumed % self.order.n} of epoch {self.consumed // self.order.n})")
        return int(state["step"]) + 1

    def train(self) -> None:
        cfg = self.cfg
        total = cfg.trainer.total_steps
        start = self.resume()
        self.sync(start - 1)  # the rollouts start from the student's weights
        self.evaluate(start - 1)  # where it starts from: the "from" of the run's summary
        off = cfg.trainer.scheduler == "one_step_off"
        gen = self.launch_generate(start) if start <= total else None
        ready: Batch | None = None
        for step in range(start, total + 1):
            t_step = time.monotonic()
            timing: dict[str, float] = {}
            self.apply_driver_faults(step)
            t = time.monotonic()
            with self.rep.phase("generate", step=step):
                batch = ready if ready is not None else self.collect_generate(gen, step)
                ready = None
            timing["generate"] = time.monotonic() - t
            if off and step < total:
                gen = self.launch_generate(step + 1)  # overlaps the teacher and the training below
            t = time.monotonic()
            with self.rep.phase("teacher_wait", step=step):
                tids, tlps = self.teacher_score(batch, step)
            timing["teacher"] = time.monotonic() - t
            t = time.monotonic()
            with self.rep.phase("train", step=step):
                m = self.wait({"student/0": self.actors["student/0"].train_step.remote(
                    batch.seqs, batch.left_pad, batch.width, tids, tlps, step)},
                    cfg.trainer.step_timeout_s, "train")["student/0"]
            timing["train"] = time.monotonic() - t
            self.consumed = batch.position
            skipped = bool(m.get("skipped"))
            stop = ""
            if skipped or not m.get("weights_finite", True):
                stop = self.on_bad_step(step, m)
            else:
                self._bad_run = []
            if stop:
                self.emit_metrics(step, m, batch, timing, evaluated=False)
                raise BadSteps(stop)
            t = time.monotonic()
            if off and step < total:
                with self.rep.phase("generate", step=step + 1, detail="waiting for the next batch"):
                    ready = self.collect_generate(gen, step + 1)
            timing["wait"] = time.monotonic() - t
            evaluated = self.eval_due(step)
            t = time.monotonic()
            # after a skipped step the rollouts already hold these weights; after the last, they are
            # needed only for its evaluation
            if not skipped and (step < total or evaluated):
                with self.rep.phase("sync_weights", step=step, timeout_s=cfg.trainer.sync_timeout_s):
                    self.sync(step)
            timing["sync"] = time.monotonic() - t
            if evaluated:  # the rollouts are idle here: the next batch is generated or not yet asked for
                t = time.monotonic()
                self.evaluate(step)
                timing["eval"] = time.monotonic() - t
            if not off and step < total:
                gen = self.launch_generate(step + 1)
            # a skipped step is not saved as such, but the run's last step is: its weights are the last good ones
            if (step % cfg.trainer.checkpoint_every == 0 and not skipped) or step == total:
                self.checkpoint(step)
            self.emit_metrics(step, m, batch, timing, evaluated)
            self.rep.set_phase("idle", step=step, detail=f"step {step} took {time.monotonic() - t_step:.2f} s")

    def emit_metrics(self, step: int, m: dict, batch: Batch, timing: dict, evaluated: bool) -> None:
        e = self.last_eval
        self.rep.emit(ev.MetricsEvent(
            step=step, loss=m["loss"], kl=m["kl"], agreement=e.get("agreement"), eval_kl=e.get("kl"),
            evaluated=evaluated, tokens_per_s=m["tokens"] / max(batch.gen_s, 1e-6), timing=timing,
            grad_norm=m.get("grad_norm"), skipped=bool(m.get("skipped")), bad_steps=self.bad_steps,
            sample_agreement=m.get("sample_agreement"), completion_len=m.get("completion_len"),
            eos_share=m.get("eos_share"), data_position=batch.position,
            epoch=round(batch.position / self.order.n, 4)))

    def shutdown(self) -> None:
        import ray

        def stop() -> None:
            try:
                ray.shutdown()
            except Exception:
                pass

        t = threading.Thread(target=stop, daemon=True)
        t.start()
        t.join(15)  # ray.shutdown is a wait too


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    a = p.parse_args(argv)
    die_with_supervisor()
    os.environ.update(QUIET_ENV)
    import torch

    torch.set_num_threads(1)
    try:
        cfg = config_mod.load_config(a.config)
    except config_mod.ConfigError as e:
        print(f"gkd driver: invalid config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    os.environ.update(cfg.trainer.env)  # the driver's own collectives and Ray's workers alike
    if cfg.rollout.engine == "vllm":
        from gkd_core.trainer.vllm_engine import EngineUnavailable, require_vllm

        try:
            require_vllm()
        except EngineUnavailable as e:
            print(f"gkd driver: {e}", file=sys.stderr)
            return EXIT_CONFIG
    from gkd_core.trainer.guarded import WaitTimeout, WorkerFailed
    from gkd_core.teacher.client import TeacherUnavailable

    from gkd_core.trainer.data import DataError

    drv = Driver(cfg, Path(a.run_dir))
    code = 0
    try:
        drv.start()
        drv.train()
        drv.rep.set_phase("finished")
    except DataError as e:  # nothing has started: what to fix in the config or the files
        print(f"gkd driver: {e}", file=sys.stderr, flush=True)
        drv.rep.log(str(e), level="error")
        drv.rep.set_phase("failed", detail=str(e)[:300])
        code = EXIT_CONFIG
    except (WaitTimeout, WorkerFailed, TeacherUnavailable, BadSteps) as e:
        print(f"gkd driver: {e}", file=sys.stderr, flush=True)
        drv.rep.log(str(e), level="error")
        drv.rep.set_phase("failed", detail=str(e)[:300])
        code = EXIT_STUCK
    except Exception as e:
        traceback.print_exc()
        drv.rep.set_phase("failed", detail=f"{type(e).__name__}: {e}"[:300])
        code = 1
    finally:
        drv.rep.close(2.0)
        drv.shutdown()
        drv.inbox.close()
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # Ray's threads must not keep a finished driver alive
