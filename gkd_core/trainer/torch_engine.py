"""The torch rollout engine: Hugging Face ``generate`` on the rollout worker's copy of the student, a batch
of left-padded prompts at a time. The default, and the reference the vLLM engine is held to (greedy
decoding gives the same tokens for the same weights: tests/on_vllm)."""

from __future__ import annotations

import numpy as np
import torch

from gkd_core.trainer import loss as L


@torch.no_grad()
def generate(model, prompt_ids: np.ndarray, left_pad: np.ndarray, *, eos_ids: list[int], pad_id: int,
             max_new_tokens: int, temperature: float, seed: int) -> np.ndarray:
    """[B, P + new] rows: the left-padded prompts, then the completions (pad after EOS); greedy at
    ``temperature`` 0, else sampled from the whole distribution."""
    device = next(model.parameters()).device
    torch.manual_seed(seed)
    ids = torch.as_tensor(np.array(prompt_ids), dtype=torch.long, device=device)
    mask, _ = L.attention(torch.as_tensor(np.array(left_pad), dtype=torch.long, device=device), ids.shape[1])
    sampling = ({"do_sample": False} if temperature <= 0 else
                {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0})
    out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, eos_token_id=eos_ids,
                         pad_token_id=pad_id, **sampling)
    return out.cpu().numpy().astype(np.int32)
