"""The teacher served by vLLM (`teacher.engine=vllm`): the same top-k log-probs as the torch teacher for the
same model and left-padded rows, from vLLM's prompt_logprobs."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs

needs("vllm", "GKD_REQUIRE_VLLM", ".venv-vllm")

# the imports below come after needs(), which skips this module where vLLM is missing
from tiny_hf import model as tiny_model  # noqa: E402
from tiny_hf import tokenizer  # noqa: E402

from gkd_core.trainer import data, torch_engine  # noqa: E402
from gkd_core.trainer.vllm_teacher import VllmScorer  # noqa: E402

pytestmark = pytest.mark.slow
K = 8


def test_vllm_scores_each_position_as_the_torch_teacher_does(tmp_path):
    from transformers import AutoModelForCausalLM

    tok = tokenizer()
    tiny_model(tok, "qwen2", 128, seed=1, heads=4, layers=2).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    rows = [tok.apply_chat_template([{"role": "user", "content": "what is one plus two?" + " please" * i}],
                                    add_generation_prompt=True, tokenize=True) for i in range(4)]
    rows = [(r["input_ids"] if hasattr(r, "keys") else r) + [7, 9, 11] for r in rows]  # and a completion
    ids, pads = data.left_pad(rows, tok.pad_token_id)
    assert len(set(pads.tolist())) > 1  # rows of several widths: the shift must hold under padding
    want_ids, want_logp = torch_engine.score(AutoModelForCausalLM.from_pretrained(tmp_path).eval(), ids, K, pads)
    scorer = VllmScorer(str(tmp_path), topk=K, max_model_len=128)
    try:
        got_ids, got_logp = scorer.score(ids, K, pads)
    finally:
        scorer.close()
    assert got_ids.shape == want_ids.shape == (len(rows), ids.shape[1], K)
    for r, pad in enumerate(pads):
        real = slice(int(pad), None)  # the pads' answers are the loss's to mask
        np.testing.assert_allclose(got_logp[r, real], want_logp[r, real], atol=2e-4, err_msg=f"row {r}")
        # the same tokens, up to the order of near ties
        close = np.isclose(want_logp[r, real][:, :-1], want_logp[r, real][:, 1:], atol=2e-4)
        order = (got_ids[r, real] == want_ids[r, real])
        assert (order[:, :-1] | close).all() and order[:, 0].all(), f"row {r}"
    assert np.isfinite(got_logp).all()
