"""The Ray actors of a run: the student, the rollout workers and the teacher service, each a
``WorkerBase`` (``worker_base``)."""

from __future__ import annotations

import functools
import math
import time
from pathlib import Path

import msgspec
import numpy as np
import ray
import torch
from safetensors.torch import load_file

from gkd_core.config import Config
from gkd_core.teacher.server import TeacherProxy, TeacherWorkerLoop
from gkd_core.trainer import loss as L
from gkd_core.trainer import models, torch_engine
from gkd_core.trainer.engine_stats import EngineStatsWatch
from gkd_core.trainer.fingerprints import fingerprint
from gkd_core.trainer.step_result import EvalResult, Shape, StepResult
from gkd_core.trainer.vllm_engine import VllmEngine
from gkd_core.trainer.vllm_teacher import VllmScorer
from gkd_core.trainer.worker_base import NonFiniteWeights, WorkerBase, WorkerContext
from gkd_core.vocab import src_of


class StudentActor(WorkerBase):
    """The trainable student: trains on the teacher's top-k, sends its weights to the rollouts.

    Batches are rows left-padded to one prompt width (``width``) followed by the completion;
    ``left_pad`` [B] says how many pads each row starts with."""

    def __init__(self, ctx: WorkerContext, cfg: dict):
        super().__init__("student/0", "student", 0, ctx)
        self.cfg = msgspec.convert(cfg, Config)
        m = self.cfg.model
        # the set-up deadline the diagnosis judges a silence in it by: the driver's own for the actors
        with self.rep.phase("init_model", timeout_s=self.cfg.trainer.init_timeout_s, detail=m.path):
            self.model, self.tok = models.load_model(m.path, m.dtype, trust_remote_code=m.trust_remote_code)
            self.model.to(self.device)
            if m.gradient_checkpointing:
                self.model.gradient_checkpointing_enable()
                self.model.config.use_cache = False
            self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.cfg.actor.lr)
        self.eos = models.eos_ids(self.model, self.tok)
        self.rep.set_phase("idle")

    def _batch(self, seqs: np.ndarray, left_pad: np.ndarray, width: int, t_ids: np.ndarray, t_logp: np.ndarray):
        # arrays from Ray's object store are read-only: copy them into tensors
        ids = torch.tensor(seqs, dtype=torch.long, device=self.device)
        attn, pos = L.attention(torch.tensor(left_pad, dtype=torch.long, device=self.device), ids.shape[1])
        tid = torch.tensor(t_ids, dtype=torch.long, device=self.device)[:, :-1]
        tlp = torch.tensor(t_logp, dtype=torch.float32, device=self.device)[:, :-1]
        mask = L.completion_mask(ids, width, self.eos)[:, 1:]
        return ids, attn, pos, tid, tlp, mask

    def _micro_batches(self, ids, attn, pos):
        """(rows, the student's logits for them), one micro batch at a time, checking for a cancel."""
        size = self.cfg.actor.micro_batch_size
        for lo in range(0, len(ids), size):
            self._check_cancel()
            sl = slice(lo, lo + size)
            yield sl, self.model(input_ids=ids[sl], attention_mask=attn[sl], position_ids=pos[sl]).logits[:, :-1]

    @staticmethod
    @torch.no_grad()
    def _kl_and_agreement(logits, tid, tlp, mask) -> tuple[float, float]:
        """Summed over the completion tokens: forward KL, and how many the student's top-1 is the teacher's."""
        kl = (L.token_divergence(logits, tid, tlp, loss="forward_kl") * mask).sum().item()
        return kl, ((logits.argmax(-1) == tid[..., 0]).float() * mask).sum().item()

    @staticmethod
    def _shape_stats(ids: torch.Tensor, mask: torch.Tensor, eos: list[int]) -> Shape:
        """Mean completion length (EOS included) and the share of completions that reached EOS."""
        lengths = mask.sum(1)
        last = (mask.cumsum(1) == lengths[:, None]) & (mask > 0)  # each row's last completion token
        ended = (torch.isin(ids[:, 1:], torch.as_tensor(eos, device=ids.device)) & last).any(1)
        return Shape(completion_len=lengths.mean().item(), eos_share=ended.float().mean().item())

    def train_step(self, seqs: np.ndarray, left_pad: np.ndarray, width: int, t_ids: np.ndarray,
                   t_logp: np.ndarray, step: int) -> StepResult:
        self._begin()
        with self.rep.phase("train", step=step):
            self._maybe_faults(step, "train")
            a = self.cfg.actor
            ids, attn, pos, tid, tlp, mask = self._batch(seqs, left_pad, width, t_ids, t_logp)
            n_tokens = mask.sum().clamp(min=1.0)  # the global count across micro batches
            self.model.train()
            self.opt.zero_grad()
            total = kl_sum = agree = 0.0
            for sl, logits in self._micro_batches(ids, attn, pos):
                loss = L.distill_loss(logits, tid[sl], tlp[sl], mask[sl], n_tokens=n_tokens, loss=a.loss,
                                      beta=a.beta, temperature=a.temperature)
                loss.backward()
                total += loss.item()
                kl, same = self._kl_and_agreement(logits, tid[sl], tlp[sl], mask[sl])
                kl_sum, agree = kl_sum + kl, agree + same
            if self.ctx.faults.nan_grad(step):
                self.rep.log(f"fault injected: a NaN gradient at step {step}", level="warn")
                next(self.model.parameters()).grad.fill_(float("nan"))
            skipped, norm, finite = self._guarded_update(step, total, a.max_grad_norm)
            return StepResult(loss=total, kl=kl_sum / n_tokens.item(), tokens=int(n_tokens.item()),
                              sample_agreement=agree / n_tokens.item(), shape=self._shape_stats(ids, mask, self.eos),
                              grad_norm=norm, skipped=skipped, weights_finite=finite)

    @torch.no_grad()
    def evaluate(self, seqs: np.ndarray, left_pad: np.ndarray, width: int, t_ids: np.ndarray,
                 t_logp: np.ndarray, step: int) -> EvalResult:
        """The student's own (greedy) completions of held-out prompts against the teacher: KL, the
        divergence being optimised, top-1 agreement per completion token, length, EOS share."""
        self._begin()
        with self.rep.phase("evaluate", step=step, detail=f"{len(seqs)} held-out prompts"):
            a = self.cfg.actor
            ids, attn, pos, tid, tlp, mask = self._batch(seqs, left_pad, width, t_ids, t_logp)
            n = mask.sum().clamp(min=1.0).item()
            self.model.eval()
            div = kl = agree = 0.0
            for sl, logits in self._micro_batches(ids, attn, pos):
                div += (L.token_divergence(logits, tid[sl], tlp[sl], loss=a.loss, beta=a.beta,
                                           temperature=a.temperature) * mask[sl]).sum().item()
                k, same = self._kl_and_agreement(logits, tid[sl], tlp[sl], mask[sl])
                kl, agree = kl + k, agree + same
            return EvalResult(divergence=div / n, kl=kl / n, agreement=agree / n,
                              shape=self._shape_stats(ids, mask, self.eos))

    def _guarded_update(self, step: int, loss: float, max_norm: float) -> tuple[bool, float, bool]:
        """Clip and apply the gradients, unless the loss or the gradient norm is not finite: then
        the step is dropped (the weights stay as they were) and said so. (skipped, the gradient
        norm, the weights finite after it)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        # clip_grad_norm_ returns the norm before clipping; inf as the limit only measures it
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf")))
        if not (math.isfinite(loss) and math.isfinite(norm)):
            self.opt.zero_grad(set_to_none=True)
            self.rep.log(f"step {step} skipped: loss {loss:.4g}, gradient norm {norm:.4g}", level="error")
            return True, norm, True
        self.opt.step()
        finite = all(bool(torch.isfinite(p.detach()).all()) for p in params)
        return False, norm, finite

    def sync_send(self, sync_id: int, step: int, timeout_s: float) -> str:
        self._begin()
        with self.rep.phase("sync_weights", step=step, timeout_s=timeout_s, detail=f"sync {sync_id}: broadcast"):
            self.ctx.faults.fire_armed(self.src, lambda m: self.rep.log(m, level="warn"), lambda: self.rep.flush(10.0))
            self._armed_point(step)
            f = self.ctx.faults.take("hang_sync", step)
            if f:  # the broadcast's root never joins it: the rollouts wait inside it for the student
                self._hang(f"{self.src} sync_weights at step {step}", f.seconds)
            with self._sync_part(sync_id, "gather", step):
                vec = torch.nn.utils.parameters_to_vector([p.detach() for p in self.model.parameters()]).contiguous()
                if not bool(torch.isfinite(vec).all()):  # the rollouts keep what they have
                    raise NonFiniteWeights(f"{self.src}: the weights are not finite; sync {sync_id} not sent")
            with self._sync_part(sync_id, "broadcast", step):
                self._broadcast(vec, timeout_s, step)
            with self._sync_part(sync_id, "verify", step):
                return fingerprint(self.model.parameters())

    def save(self, folder: str) -> bool:
        with self.rep.phase("checkpoint", detail=folder):
            path = Path(folder)
            path.mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(str(path))
            self.tok.save_pretrained(str(path))
            torch.save(self.opt.state_dict(), path / "optimizer.pt")
        return True

    def load(self, folder: str) -> str:
        with self.rep.phase("init_model", timeout_s=self.cfg.trainer.init_timeout_s, detail=f"resume from {folder}"):
            state = load_file(str(Path(folder) / "model.safetensors"), device=str(self.device))
            self.model.load_state_dict(state, strict=False)
            self.model.tie_weights()
            self.opt.load_state_dict(torch.load(Path(folder) / "optimizer.pt", weights_only=True,
                                                map_location=self.device))
        return fingerprint(self.model.parameters())

    def checkpoint_bytes(self) -> int:
        """About what a checkpoint takes: the weights and the optimizer's two moments (AdamW)."""
        return sum(p.numel() * p.element_size() + 2 * p.numel() * 4 for p in self.model.parameters())


class RolloutWorker(WorkerBase):
    """Generates with the torch engine from the student's weights, received over the group."""

    def __init__(self, rank: int, ctx: WorkerContext, cfg: dict):
        super().__init__(src_of("rollout", rank), "rollout", rank, ctx)
        self.cfg = msgspec.convert(cfg, Config)
        m = self.cfg.model
        with self.rep.phase("init_engine", timeout_s=self.cfg.trainer.init_timeout_s,
                            detail=f"engine {self.cfg.rollout.engine}"):
            self.model, self.tok = models.load_model(m.path, m.dtype, trust_remote_code=m.trust_remote_code)
            self.model.to(self.device).eval()
            self.eos = models.eos_ids(self.model, self.tok)
            self.pad = models.pad_id(self.tok, self.eos)
            self.engine = None
            if self.cfg.rollout.engine == "vllm":
                self.engine = self._vllm_engine()
                self.closers += [EngineStatsWatch(self.engine.stats, self.rep).close, self.engine.close]
        self.rep.set_phase("idle")

    def _vllm_engine(self):
        m = self.cfg.model
        return VllmEngine(m.path, gpu_memory_utilization=self.cfg.rollout.gpu_memory_utilization, dtype=m.dtype,
                          eos_ids=self.eos, pad_id=self.pad)

    @torch.no_grad()
    def generate(self, prompt_ids: np.ndarray, left_pad: np.ndarray, step: int, seed: int,
                 greedy: bool = False) -> tuple[np.ndarray, float]:
        """[B, P + new] rows: the left-padded prompts, then the completions (pad after EOS)."""
        self._begin()
        what = "evaluate" if greedy else "generate"
        with self.rep.phase(what, step=step, detail=f"{len(prompt_ids)} prompts"):
            if not greedy:
                self._maybe_faults(step, "generate")
                f = self.ctx.faults.take("hang_generate", step)
                if f:
                    self._hang(f"{self.src} generate at step {step}", f.seconds)
            t0 = time.perf_counter()
            r = self.cfg.rollout
            temperature = 0.0 if greedy else r.temperature
            if self.engine is not None:
                out = self.engine.generate(prompt_ids, left_pad, temperature=temperature,
                                           max_new_tokens=r.max_new_tokens, seed=seed)
            else:
                out = torch_engine.generate(self.model, prompt_ids, left_pad, eos_ids=self.eos, pad_id=self.pad,
                                            max_new_tokens=r.max_new_tokens, temperature=temperature, seed=seed)
            if not greedy:
                self._slow_down(step, time.perf_counter() - t0)
            return out, time.perf_counter() - t0

    def _slow_down(self, step: int, took: float) -> None:
        """The `slow_worker` fault: a worker that is slower, not stuck (a weaker GPU, a throttled node)."""
        factor = self.ctx.faults.slow_factor(step)
        if factor:
            time.sleep(took * factor)

    def sync_rollout_weights(self, sync_id: int, step: int, timeout_s: float) -> str:
        self._begin()
        with self.rep.phase("sync_weights", step=step, timeout_s=timeout_s, detail=f"sync {sync_id}: receive"):
            self._armed_point(step)
            f = self.ctx.faults.take("hang_sync", step)
            if f:
                self._hang(f"{self.src} sync_weights at step {step}", f.seconds)
            params = list(self.model.parameters())
            vec = torch.nn.utils.parameters_to_vector([p.detach() for p in params]).contiguous()
            with self._sync_part(sync_id, "broadcast", step):
                self._broadcast(vec, timeout_s, step)
            skip = self.ctx.faults.take("skip_weight_push", step)
            if skip:
                self.rep.log(f"fault injected: {self.src} keeps the weights of the sync before in its "
                             f"{self.cfg.rollout.engine} engine (step {step})", level="warn")
            if self.engine is None:
                with self._sync_part(sync_id, "load", step):
                    if not skip:
                        torch.nn.utils.vector_to_parameters(vec, params)
                with self._sync_part(sync_id, "verify", step):
                    return fingerprint(params)
            # the torch copy names and shapes them; the engine's own weights are what it generates with,
            # so its fingerprint is read back from them
            torch.nn.utils.vector_to_parameters(vec, params)
            named = dict(self.model.named_parameters())
            if not skip:
                with self.rep.phase("sync_weights", step=step, timeout_s=timeout_s,
                                    detail=f"sync {sync_id}: into the {self.cfg.rollout.engine} engine"):
                    with self._sync_part(sync_id, "load", step, delay_inside=True) as delay_s:
                        self.engine.load_weights(named, timeout_s, delay_s=delay_s)
                    with self._sync_part(sync_id, "reset_cache", step):
                        self.engine.reset_cache()
            with self._sync_part(sync_id, "verify", step):
                return self.engine.fingerprint([(n, tuple(t.shape)) for n, t in named.items()], timeout_s)


class TeacherProxyActor(WorkerBase):
    def __init__(self, ctx: WorkerContext, host: str = "127.0.0.1"):
        """``host`` empty: this node's Ray address (the teacher's workers may be on other nodes)."""
        super().__init__("teacher/proxy", "teacher", None, ctx)  # type: ignore[arg-type]
        self.proxy = TeacherProxy(self.rep, host=host or ray.util.get_node_ip_address())
        self.proxy.start()
        self.closers += [self.proxy.stop, self.proxy.report]  # the counts at the end, with the last answers in them
        self.rep.set_phase("serve", detail=self.proxy.frontend_address)

    def addresses(self) -> dict:
        return {"frontend": self.proxy.frontend_address, "backend": self.proxy.backend_address}


class TeacherWorkerActor(WorkerBase):
    def __init__(self, rank: int, ctx: WorkerContext, teacher_path: str, backend: str | list[ray.ObjectRef],
                 trust_remote_code: bool = False, engine: str = "torch", topk: int = 16, init_timeout_s: float = 300.0):
        """``backend``: the proxy's backend address, or (a proxy starting beside this worker) a one-element list
        of the reference to its ``addresses()``, taken once the model is loaded, within ``init_timeout_s``."""
        super().__init__(src_of("teacher", rank), "teacher", rank, ctx)
        with self.rep.phase("init_model", detail=f"{teacher_path} (engine {engine})"):
            if engine == "vllm":
                scorer = VllmScorer(teacher_path, topk=topk)
                self.closers += [EngineStatsWatch(scorer.stats, self.rep).close, scorer.close]
                score = scorer.score
            else:
                self.model, _ = models.load_model(teacher_path, device=str(self.device),
                                                  trust_remote_code=trust_remote_code)
                self.model.eval()
                score = functools.partial(torch_engine.score, self.model)
        if not isinstance(backend, str):
            with self.rep.phase("init", timeout_s=init_timeout_s, detail="waiting for the teacher proxy's address"):
                backend = str(ray.get(backend[0], timeout=init_timeout_s)["backend"])
        self.loop = TeacherWorkerLoop(self.src, backend, score, self.rep, on_request=self._at_request)
        self.loop.start()
        self.closers.insert(0, self.loop.stop)  # no request reaches an engine that is closing
        self.rep.set_phase("idle")

    def _at_request(self) -> None:
        """A request arrived: where a fault armed for a teacher worker strikes (it knows no step: 0)."""
        self._armed_point(0)
        f = self.ctx.faults.take("error_teacher", 0)
        if f:
            self.set_errors(f.seconds)

    def set_delay(self, seconds: float) -> bool:
        self.loop.delay_s = seconds
        return True

    def set_errors(self, seconds: float) -> bool:
        """The ``error_teacher`` fault: every request answered with an error for ``seconds`` (0: until the end)."""
        self.rep.log(f"fault injected: {self.src} answers every request with an error"
                     + (f" for {seconds:g} s" if seconds else ""), level="warn")
        self.loop.errors_until = time.monotonic() + seconds if seconds else float("inf")
        return True
