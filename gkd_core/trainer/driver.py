"""The GKD driver: the training loop on Ray, run by the supervisor as its child.

``python -m gkd_core.trainer.driver --config RUN/restarts/NNN.yaml --run-dir RUN``

Student generates (rollout workers), the teacher returns top-k log-probs for the student's
tokens, the student trains on a divergence against them, the weights go back to the rollout
workers over a collective group. The loop is here; its parts are modules of their own:

- ``inputs``: what the run trains on (model folders, prompts), checked before anything starts;
- ``cluster``: Ray, the actors, the collective group, and every wait (a deadline and a name);
- ``replacing``: a worker that died started again in its place, and the wait it failed done again;
- ``schedulers``: when the next batch is generated (``sync``, ``one_step_off``);
- ``weight_sync``: the student's weights to the rollouts, fingerprinted;
- ``saver``: checkpoints that fit, and resuming from the newest complete one;
- ``loggers``: each step's metrics to the console, TensorBoard, W&B (``trainer.logger``);
- ``actions``: commands forwarded by the supervisor (stacks, cancel), served during every wait;
- ``faults``: the injected faults, typed, each fired where it belongs (the teacher's: ``teacher_faults``).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import msgspec
import numpy as np
import torch

from gkd_core import config as config_mod
from gkd_core.errors import GkdError
from gkd_core.lifeline import die_with_supervisor
from gkd_core.rundir import gkd_home
from gkd_core.teacher.client import TeacherClient, TeacherUnavailable
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.commands import CommandInbox
from gkd_core.telemetry.reporter import Reporter
from gkd_core.trainer import data, inputs, replacing
from gkd_core.trainer.actions import Actions
from gkd_core.trainer.batch import Batch, Pending
from gkd_core.trainer.cluster import CLOSE_S, QUIET_ENV, Cluster
from gkd_core.trainer.data import DataError
from gkd_core.trainer.faults import FaultPlan
from gkd_core.trainer.guarded import EXIT_STUCK, WaitTimeout, WorkerFailed
from gkd_core.trainer.loggers import MetricLoggers
from gkd_core.trainer.replacing import RolloutReplacer
from gkd_core.trainer.saver import Saver
from gkd_core.trainer.schedulers import SCHEDULERS, Scheduler
from gkd_core.trainer.step_result import EvalResult, StepResult
from gkd_core.trainer.teacher_faults import TeacherFaults
from gkd_core.trainer.vllm_engine import EngineUnavailable, require_vllm
from gkd_core.trainer.weight_sync import WeightSync
from gkd_core.vocab import WorkerId, src_of

EXIT_CONFIG = 2


class BadSteps(GkdError, RuntimeError):
    """Steps in a row whose loss or gradient was not finite: the run stops instead of training on."""


class Driver:
    def __init__(self, cfg: config_mod.Config, run_dir: Path):
        self.cfg = cfg
        self.run_dir = run_dir
        self.restart = int(os.environ.get("GKD_RESTART", "0"))
        self.rep = Reporter("driver", heartbeat_s=cfg.telemetry.heartbeat_s)
        self.inbox = CommandInbox()  # at once: the supervisor sees a driver it can forward commands to
        self.rep.register("driver", 0, node=socket.gethostname())
        # faults fire in the first incarnation only: a restart is how you get past them
        self.faults = FaultPlan.for_run(cfg.faults, self.restart)
        self.bad_steps = 0
        self._bad_run: list[int] = []  # the current run of skipped steps
        self.consumed = 0  # the data position after the last trained step's prompts (kept in checkpoints)
        self.last_eval: EvalResult | None = None
        self._cluster: Cluster | None = None  # made by ``start``; ``close`` may come first
        self.loggers = MetricLoggers([], run_dir, {}, self.rep.log)  # (trainer.logger's, once ``start`` has the config)

    @property
    def cluster(self) -> Cluster:
        assert self._cluster is not None, "the cluster is made by start"
        return self._cluster

    # --- start ---------------------------------------------------------------------------

    def start(self) -> None:
        # a restart reads the data and the models' folders again while Ray starts (most of the one is importing the
        # tokenizers' code, most of the other waiting for Ray's processes: two seconds of every restart); a first
        # start refuses bad inputs before Ray starts, in seconds
        loaded = inputs.prepare_in_background(self.cfg, gkd_home(), log=self.rep.log)

        def read() -> None:
            with self.rep.phase("load_data"):
                self.inputs = loaded.result()  # (its error, a data file that cannot be read, raised here)

        if not self.restart:
            read()
        device = self.cfg.trainer.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._cluster = Cluster(self.cfg, self.run_dir, self.rep, self.faults, device)
        self.cluster.connect()
        if self.restart:
            read()
        self.cfg = cfg = self.inputs.cfg  # the model folders resolved: workers load exactly these
        self.rep.log(self.inputs.said)
        self.loggers = MetricLoggers(cfg.trainer.logger, self.run_dir, msgspec.to_builtins(cfg), self.rep.log)
        self.order = data.PromptOrder(len(self.inputs.train.ids), cfg.data.seed)
        self.sync = WeightSync(self.cluster, self.rep, cfg.trainer.sync_timeout_s)
        self.actions = Actions(self.cluster, self.rep, self.run_dir, self.inbox, self.sync.request_cancel)
        self.cluster.on_tick = self.sync.on_tick = self.actions.serve
        self.saver = Saver(cfg, self.run_dir, self.rep, self.cluster, self.faults, self.restart)
        self.cluster.start_workers(cfg)
        self.teacher_faults = TeacherFaults(self.faults, self.cluster, self.rep)
        self.rollouts = RolloutReplacer(self.cluster, cfg.trainer.replace_rollouts)
        self.teacher = TeacherClient(self.cluster.teacher_address, num_microbatches=cfg.teacher.num_microbatches,
                                     max_in_flight=cfg.teacher.max_in_flight, timeout_s=cfg.teacher.request_timeout_s,
                                     max_retries=cfg.teacher.max_retries, reporter=self.rep)

    def resume(self) -> int:
        """The first step to train: after the newest checkpoint's, with the data where it stood."""
        state = self.saver.resume()
        if state is None:
            return 1
        self.sync.sync_id = state.get("sync_id", 0)
        # prompts handed out by the steps saved (older checkpoints: steps x batch)
        self.consumed = self.order.position = int(state.get("prompts_consumed",
                                                            state["step"] * self.cfg.data.batch_size))
        self.rep.log(f"resumed from {state['folder']} (step {state['step']}, prompt "
                     f"{self.consumed % self.order.n} of epoch {self.consumed // self.order.n})")
        if "metrics" in state:  # said again: the driver before may have died before they left
            said = msgspec.convert(state["metrics"], ev.MetricsEvent)
            said.ts, said.src = 0.0, ""
            self.rep.emit(said)
        return int(state["step"]) + 1

    # --- one step's parts ------------------------------------------------------------------

    def launch_generate(self, step: int) -> Pending:
        """The next batch of prompts, out to the rollouts."""
        rows = [self.inputs.train.ids[i] for i in self.order.take(self.cfg.data.batch_size)]
        return self._send(rows, step, seed=self.cfg.data.seed * 100_003 + step * 31, greedy=False,
                          position=self.order.position)

    def _send(self, rows: list[list[int]], step: int, seed: int, greedy: bool, position: int) -> Pending:
        ids, pads = data.left_pad(rows, self.inputs.pad_id)
        n = self.cfg.rollout.n_workers
        actors = self.cluster.actors
        parts = np.array_split(np.arange(len(ids)), n)
        refs = {src: actors[src].generate.remote(ids[idx], pads[idx], step, seed + i, greedy)
                for i, idx in enumerate(parts) if len(idx) for src in [src_of("rollout", i)]}
        return Pending(refs, pads, ids.shape[1], position, rows, step, seed, greedy)

    def resend(self, p: Pending) -> Pending:
        """The same prompts out again, as they were: a rollout generating them died and was replaced."""
        return self._send(p.rows, p.step, p.seed, p.greedy, p.position)

    def regenerate(self, sched: Scheduler, weights_of: int) -> None:
        """After a rollout generating the batch in flight was replaced: the student's weights (those of step
        ``weights_of``) to every rollout, the new one among them, then the batch sent again."""
        self.sync(weights_of)
        sched.again(self.resend)

    def collect_generate(self, pending: Pending, step: int, what: str = "generate") -> Batch:
        out = self.cluster.wait(pending.refs, self.cfg.trainer.step_timeout_s, what,
                                hint="dump the rollout's stack (d); restart smaller (r) if it is out of memory")
        seqs = [out[k][0] for k in sorted(out, key=lambda s: WorkerId.parse(s).rank or 0)]  # (each has a rank)
        width = max(s.shape[1] for s in seqs)
        batch = np.concatenate([np.pad(s, ((0, 0), (0, width - s.shape[1])), constant_values=self.inputs.pad_id)
                                for s in seqs])
        return Batch(batch, pending.left_pad, pending.width, pending.position, max(out[k][1] for k in out))

    def teacher_score(self, batch: Batch, step: int) -> tuple[np.ndarray, np.ndarray]:
        deadline = time.monotonic() + self.cfg.trainer.step_timeout_s
        while True:
            self.teacher_faults.back()
            try:
                return self.teacher.score(batch.seqs, self.cfg.teacher.topk, on_wait=self.on_teacher_wait,
                                          left_pad=batch.left_pad)
            except TeacherUnavailable as e:
                if time.monotonic() > deadline:
                    raise
                self.rep.log(f"step {step}: {e}; retrying the step's teacher scoring", level="error")
                self.rep.set_phase("teacher_wait", step=step, detail=f"teacher unavailable, retrying: {e}"[:300])

    def on_teacher_wait(self) -> None:
        self.teacher_faults.back()
        self.revive_teacher()
        self.actions.serve()

    def revive_teacher(self) -> None:
        """A teacher actor Ray reports dead is started again, and what was in flight is sent again
        at once (to the new proxy's address, if it was the proxy) instead of at its timeout."""
        started = replacing.revive_teacher(self.cluster, self.cluster.dead_teacher())
        if started:
            self.teacher.resend(self.cluster.teacher_address)

    def train_step(self, batch: Batch, tids: np.ndarray, tlps: np.ndarray, step: int) -> StepResult:
        student = self.cluster.actors["student/0"]
        return self.cluster.wait({"student/0": student.train_step.remote(
            batch.seqs, batch.left_pad, batch.width, tids, tlps, step)}, self.cfg.trainer.step_timeout_s,
            "train")["student/0"]

    def evaluate(self, step: int) -> None:
        """The held-out prompts, completed greedily by the rollouts (which hold the newest weights),
        scored by the teacher and measured by the student."""
        if not self.inputs.val:
            return
        with self.rep.phase("evaluate", step=step, detail=f"{len(self.inputs.val)} held-out prompts"):
            batch = self.collect_generate(self._send(self.inputs.val, step, seed=0, greedy=True,
                                                     position=self.order.position), step, "evaluate")
            tids, tlps = self.teacher_score(batch, step)
            student = self.cluster.actors["student/0"]
            self.last_eval = self.cluster.wait(
                {"student/0": student.evaluate.remote(batch.seqs, batch.left_pad, batch.width, tids, tlps, step)},
                self.cfg.trainer.step_timeout_s, "evaluate")["student/0"]

    def eval_due(self, step: int) -> bool:
        every = self.cfg.trainer.eval_every
        return step == self.cfg.trainer.total_steps or (every > 0 and step % every == 0)

    # --- bad steps ---------------------------------------------------------------------------

    def on_bad_step(self, step: int, m: StepResult) -> str:
        """A skipped step, counted. After ``max_bad_steps`` in a row the run must stop: the error,
        naming the last good checkpoint and how to go on from it."""
        self.bad_steps += 1 if m.skipped else 0
        self._bad_run.append(step)
        limit = self.cfg.trainer.max_bad_steps
        if len(self._bad_run) < limit and m.weights_finite:
            return ""
        last = self.saver.latest()
        where = self.saver.where(last) if last else "none yet (a restart begins at step 1)"
        why = (f"{len(self._bad_run)} steps in a row had a non-finite loss or gradient "
               f"(steps {self._bad_run[0]}-{self._bad_run[-1]}, gradient norm {m.grad_norm})"
               if m.weights_finite else f"the student's weights are not finite after step {step}")
        return (f"{why}; the rollouts kept the last good weights. Last good checkpoint: {where}. "
                f"Try: gkd-tui restart {self.run_dir} -o actor.lr={self.cfg.actor.lr / 10:g}"
                + ("" if self.cfg.actor.max_grad_norm else " -o actor.max_grad_norm=1.0")
                + (" -o model.dtype=bfloat16" if self.cfg.model.dtype == "float16" else ""))

    # --- the loop ------------------------------------------------------------------------

    def train(self) -> None:
        cfg = self.cfg
        total = cfg.trainer.total_steps
        start = self.resume()
        # every wait on the rollouts is done again after a rollout that died in it is replaced (when the run
        # replaces them: trainer.replace_rollouts): a sync by itself; a generation after the weights are synced
        # to the new one
        again = self.rollouts.retried
        again(partial(self.sync, start - 1))  # the rollouts start from the student's weights
        # where it starts from: the "from" of the run's summary
        again(partial(self.evaluate, start - 1), partial(self.sync, start - 1))
        sched: Scheduler = SCHEDULERS[cfg.trainer.scheduler](self.launch_generate, self.collect_generate, self.rep)
        if start <= total:
            sched.start(start)
        for step in range(start, total + 1):
            last = step == total
            t_step = time.monotonic()
            timing: dict[str, float] = {}
            self.teacher_faults.at_step(step)
            t = time.monotonic()
            with self.rep.phase("generate", step=step):
                batch = again(partial(sched.batch, step), partial(self.regenerate, sched, step - 1))
            timing["generate"] = time.monotonic() - t
            sched.during_train(step, last)
            t = time.monotonic()
            with self.rep.phase("teacher_wait", step=step):
                tids, tlps = self.teacher_score(batch, step)
            timing["teacher"] = time.monotonic() - t
            t = time.monotonic()
            with self.rep.phase("train", step=step):
                m = self.train_step(batch, tids, tlps, step)
            timing["train"] = time.monotonic() - t
            self.consumed = batch.position
            skipped = m.skipped
            stop = ""
            if skipped or not m.weights_finite:
                stop = self.on_bad_step(step, m)
            else:
                self._bad_run = []
            if stop:
                self.rep.emit(self.metrics_event(step, m, batch, timing, evaluated=False))
                raise BadSteps(stop)
            t = time.monotonic()
            # (the next batch, generated meanwhile with the weights before this step's; sent again with this one's)
            again(partial(sched.before_sync, step, last), partial(self.regenerate, sched, step))
            timing["wait"] = time.monotonic() - t
            evaluated = self.eval_due(step)
            t = time.monotonic()
            # after a skipped step the rollouts already hold these weights; after the last, they are
            # needed only for its evaluation
            if not skipped and (not last or evaluated):
                with self.rep.phase("sync_weights", step=step, timeout_s=cfg.trainer.sync_timeout_s):
                    again(partial(self.sync, step))
            timing["sync"] = time.monotonic() - t
            if evaluated:  # the rollouts are idle here: the next batch is generated or not yet asked for
                t = time.monotonic()
                again(partial(self.evaluate, step), partial(self.sync, step))
                timing["eval"] = time.monotonic() - t
            sched.after_sync(step, last)
            metrics = self.metrics_event(step, m, batch, timing, evaluated)
            # a skipped step is not saved as such, but the run's last step is: its weights are the last good ones
            if (step % cfg.trainer.checkpoint_every == 0 and not skipped) or last:
                # the step's metrics go into its checkpoint: a driver killed after the save, before they
                # left, is not asked to do the step again, so the one that resumes says them
                self.saver.save(step, {"prompts_consumed": self.consumed, "epoch": self.consumed // self.order.n,
                                       "sync_id": self.sync.sync_id, "metrics": msgspec.to_builtins(metrics)})
            self.rep.emit(metrics)
            self.loggers.write(metrics)
            self.rep.set_phase("idle", step=step, detail=f"step {step} took {time.monotonic() - t_step:.2f} s")
            replacing.revive_agents(self.cluster)  # between steps: a node agent that died is started again
            self.actions.hold(step)  # and held while a pause is asked for

    def metrics_event(self, step: int, m: StepResult, batch: Batch, timing: dict, evaluated: bool) -> ev.MetricsEvent:
        e = self.last_eval
        return ev.MetricsEvent(
            step=step, loss=m.loss, kl=m.kl, agreement=e.agreement if e else None, eval_kl=e.kl if e else None,
            evaluated=evaluated, tokens_per_s=m.tokens / max(batch.gen_s, 1e-6), timing=timing,
            grad_norm=m.grad_norm, skipped=m.skipped, bad_steps=self.bad_steps,
            sample_agreement=m.sample_agreement, completion_len=m.shape.completion_len,
            eos_share=m.shape.eos_share, data_position=batch.position,
            epoch=round(batch.position / self.order.n, 4))

    def finish(self) -> None:
        for name, why in self.cluster.close_workers(CLOSE_S).items():
            self.rep.log(f"{name} did not close ({why}): its last counts may be missing", level="warn")
        self.rep.set_phase("finished")

    def close(self) -> None:
        self.loggers.close()
        self.rep.close(2.0)
        if self._cluster is not None:
            self._cluster.shutdown()
        self.inbox.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    a = p.parse_args(argv)
    die_with_supervisor()
    os.environ.update(QUIET_ENV)
    torch.set_num_threads(1)
    try:
        cfg = config_mod.load_config(a.config)
    except config_mod.ConfigError as e:
        print(f"gkd driver: invalid config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    os.environ.update(cfg.trainer.env)  # the driver's own collectives and Ray's workers alike
    for key, engine in (("rollout.engine", cfg.rollout.engine), ("teacher.engine", cfg.teacher.engine)):
        try:
            if engine == "vllm":
                require_vllm(key)
        except EngineUnavailable as e:
            print(f"gkd driver: {e}", file=sys.stderr)
            return EXIT_CONFIG
    drv = Driver(cfg, Path(a.run_dir))
    code = 0
    try:
        drv.start()
        drv.train()
        drv.finish()
    except DataError as e:  # no worker has started (on a restart, Ray has): what to fix in the config or the files
        code = _failed(drv, str(e), EXIT_CONFIG)
    except (WaitTimeout, WorkerFailed, TeacherUnavailable, BadSteps) as e:
        code = _failed(drv, str(e), EXIT_STUCK)
    except Exception as e:
        traceback.print_exc()
        drv.rep.set_phase("failed", detail=f"{type(e).__name__}: {e}"[:300])
        code = 1
    finally:
        drv.close()
    return code


def _failed(drv: Driver, why: str, code: int) -> int:
    print(f"gkd driver: {why}", file=sys.stderr, flush=True)
    drv.rep.log(why, level="error")
    drv.rep.set_phase("failed", detail=why[:300])
    return code


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # Ray's threads must not keep a finished driver alive
