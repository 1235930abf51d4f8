"""The teacher served by vLLM: its top-k log-probs at every position of a batch, from ``prompt_logprobs``.

Same answer as the torch teacher (``TeacherWorkerActor._score``): for each row, at each position t,
the k most likely next tokens after tokens 0..t and their log-probs. vLLM gives, for a prompt, the
distribution *of* each token after the first (``prompt_logprobs[t]`` is the one predicting token t),
and for the one token it samples after the prompt, the distribution after the last: shifted by one,
that is the torch teacher's. It lists the prompt's own token beside the top k when that token is not
among them; only the top k are kept. Padding positions (left of a row) get a uniform answer: the
student's loss masks them, and they must be finite.
"""

from __future__ import annotations

import math

import numpy as np

from gkd_core.trainer.vllm_engine import engine_counts, make_llm, require_vllm, shutdown_llm


class VllmScorer:
    def __init__(self, model_path: str, *, topk: int, dtype: str = "float32", gpu_memory_utilization: float = 0.5,
                 max_model_len: int = 0):
        require_vllm("teacher.engine")
        self.llm = make_llm(model_path, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                            max_model_len=max_model_len, max_logprobs=max(topk, 20))
        self.vocab = self.llm.llm_engine.model_config.get_vocab_size()

    def score(self, ids: np.ndarray, topk: int, left_pad: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([B, T, k] token ids, [B, T, k] log-probs), best first, as the torch teacher answers."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        b, t = ids.shape
        k = min(topk, self.vocab)
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=k, logprobs=k, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=[int(x) for x in row[pad:]])
                                  for row, pad in zip(ids, left_pad, strict=True)], params, use_tqdm=False)
        top_ids = np.tile(np.arange(k, dtype=np.int32), (b, t, 1))
        top_logp = np.full((b, t, k), -math.log(self.vocab), dtype=np.float32)
        for r, (out, pad) in enumerate(zip(outs, left_pad, strict=True)):
            # position pad + j predicts token pad + j + 1: prompt_logprobs[j + 1]; the last, the sampled token's
            after = list(out.prompt_logprobs[1:]) + [out.outputs[0].logprobs[0]]
            for j, dist in enumerate(after):
                best = sorted(dist.items(), key=lambda kv: -kv[1].logprob)[:k]
                top_ids[r, pad + j] = [tok for tok, _ in best]
                top_logp[r, pad + j] = [lp.logprob for _, lp in best]
        return top_ids, top_logp

    def stats(self) -> dict:
        return engine_counts(self.llm)

    def close(self) -> None:
        shutdown_llm(self.llm)
