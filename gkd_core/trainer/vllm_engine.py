"""The vLLM rollout engine (the `vllm` extra), written against vLLM's public API.

vLLM 0.33 pins torch 2.14 and transformers < 5.21, so it cannot share an environment with the
CPU torch of a small machine: the torch engine is the default and runs everywhere; this one is
for GPU nodes where the extra is installed (`pip install -e ".[vllm]"`). Without vLLM,
choosing it is refused before anything starts.

Weights still travel over the run's own collective group into the rollout worker's torch copy
of the student (which names and shapes them); from there they are handed to the vLLM workers
with ``LLM.collective_rpc`` and a worker extension that calls the model's ``load_weights`` —
the pattern of vLLM's own RLHF examples.
"""

from __future__ import annotations

import importlib.util

import numpy as np


class EngineUnavailable(RuntimeError):
    pass


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise EngineUnavailable(
            "rollout.engine=vllm, but vLLM is not installed in this environment; install the extra on a GPU "
            "node (`pip install -e .[vllm]`, which brings its own CUDA torch) or use rollout.engine=torch"
        )


class GkdWorkerExtension:
    """Mixed into each vLLM worker by ``worker_extension_cls``; ``self.model_runner`` is the worker's."""

    def gkd_load_weights(self, names: list[str], tensors: list) -> bool:
        device = next(self.model_runner.model.parameters()).device
        self.model_runner.model.load_weights(weights=[(n, t.to(device)) for n, t in zip(names, tensors)])
        return True


class VllmEngine:
    """Generation through ``vllm.LLM`` for a model folder; weights replaced after every sync."""

    def __init__(self, model_path: str, *, gpu_memory_utilization: float, dtype: str, eos_ids: list[int],
                 pad_id: int):
        require_vllm()
        from vllm import LLM

        self.eos_ids, self.pad_id = list(eos_ids), pad_id
        self.llm = LLM(model=model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                       enforce_eager=True, worker_extension_cls=f"{__name__}.GkdWorkerExtension")

    def generate(self, prompt_ids: np.ndarray, left_pad: np.ndarray, *, temperature: float, max_new_tokens: int,
                 seed: int) -> np.ndarray:
        """Rows as the torch engine returns them: the left-padded prompt, the completion, pads."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=temperature, max_tokens=max_new_tokens, seed=seed,
                                stop_token_ids=self.eos_ids)
        prompts = [TokensPrompt(prompt_token_ids=[int(t) for t in row[pad:]])
                   for row, pad in zip(prompt_ids, left_pad)]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        rows = [list(map(int, row)) + list(o.outputs[0].token_ids) for row, o in zip(prompt_ids, outs)]
        width = max(len(r) for r in rows)
        return np.array([r + [self.pad_id] * (width - len(r)) for r in rows], dtype=np.int32)

    def load_weights(self, state: dict) -> None:
        names = list(state)
        self.llm.collective_rpc("gkd_load_weights", args=(names, [state[n].detach().cpu() for n in names]))
