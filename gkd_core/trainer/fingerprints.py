"""A model's weights in 16 hex digits: the student's, a rollout's torch copy and a vLLM engine's own
weights (read back into the student's layout) must give the same one after a sync.

Imported in vLLM's worker processes too (``vllm_engine.GkdWorkerExtension``), so it needs torch alone.
"""

from __future__ import annotations

import hashlib

import torch


def fingerprint(tensors) -> str:
    """The tensors in order, as float32 on the CPU, hashed: equal bytes, equal fingerprint."""
    vec = torch.nn.utils.parameters_to_vector([t.detach().float().cpu() for t in tensors])
    return hashlib.blake2b(vec.numpy().tobytes(), digest_size=8).hexdigest()
