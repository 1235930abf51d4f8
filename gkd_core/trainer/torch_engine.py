"""The torch engine: Hugging Face ``generate`` on the rollout worker's copy of the student, a batch of
left-padded prompts at a time, and the teacher's top-k scoring. The default, and the reference the vLLM
engines are held to (greedy decoding gives the same tokens for the same weights, scoring the same
log-probs: tests/on_vllm)."""

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


@torch.no_grad()
def score(model, ids: np.ndarray, topk: int, left_pad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([B, T, k] token ids, [B, T, k] log-probs), best first: at each position, the k most likely next
    tokens after the row so far."""
    device = next(model.parameters()).device
    x = torch.tensor(ids, dtype=torch.long, device=device)
    attn, pos = L.attention(torch.tensor(left_pad, dtype=torch.long, device=device), x.shape[1])
    logits = model(input_ids=x, attention_mask=attn, position_ids=pos).logits
    logp = torch.log_softmax(logits.float(), dim=-1)
    top = logp.topk(min(topk, logp.shape[-1]), dim=-1)
    return top.indices.cpu().numpy().astype(np.int32), top.values.cpu().numpy()
