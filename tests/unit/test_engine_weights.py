"""How weights reach a vLLM engine and come back for the fingerprint, without vLLM: the shared-memory file
its workers read, and the student's tensors cut back out of vLLM's fused and padded ones."""

from __future__ import annotations

import pytest
import torch

from gkd_core.trainer.fingerprints import fingerprint
from gkd_core.trainer.vllm_engine import ALIGN, cut_back, read_weights, write_weights

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def test_the_weights_file_gives_back_every_tensor_bit_for_bit_whatever_its_dtype(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(3, 5, generator=g), "b.bias": torch.randn(7, generator=g).to(torch.bfloat16),
               "c.scale": torch.randn(1, generator=g).half(), "d.empty": torch.zeros(0, 4)}
    index = write_weights(tmp_path / "w.bin", tensors)
    assert all(off % ALIGN == 0 for _, _, _, off, _ in index)
    back = dict(read_weights(str(tmp_path / "w.bin"), index))
    assert list(back) == list(tensors)
    for name, t in tensors.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape and torch.equal(back[name], t), name


def student_and_engine(seed: int = 0):
    """A one-layer student's tensors, and the same weights as vLLM holds them: q, k, v and gate, up fused
    along the first dimension, the vocabulary (10) padded with zero rows to 64."""
    g = torch.Generator().manual_seed(seed)
    s = {"model.embed_tokens.weight": torch.randn(10, 8, generator=g),
         "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 8, generator=g),
         "model.layers.0.self_attn.k_proj.weight": torch.randn(4, 8, generator=g),
         "model.layers.0.self_attn.v_proj.weight": torch.randn(4, 8, generator=g),
         "model.layers.0.self_attn.q_proj.bias": torch.randn(8, generator=g),
         "model.layers.0.self_attn.k_proj.bias": torch.randn(4, generator=g),
         "model.layers.0.self_attn.v_proj.bias": torch.randn(4, generator=g),
         "model.layers.0.mlp.gate_proj.weight": torch.randn(16, 8, generator=g),
         "model.layers.0.mlp.up_proj.weight": torch.randn(16, 8, generator=g),
         "model.norm.weight": torch.randn(8, generator=g)}
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    e = {"model.embed_tokens.weight": torch.cat([s["model.embed_tokens.weight"], torch.zeros(54, 8)]),
         attn + "qkv_proj.weight": torch.cat([s[attn + f"{x}_proj.weight"] for x in "qkv"]),
         attn + "qkv_proj.bias": torch.cat([s[attn + f"{x}_proj.bias"] for x in "qkv"]),
         mlp + "gate_up_proj.weight": torch.cat([s[mlp + "gate_proj.weight"], s[mlp + "up_proj.weight"]]),
         "model.norm.weight": s["model.norm.weight"].clone()}
    return s, e


def test_the_students_tensors_are_cut_back_out_of_the_engines_fused_and_padded_ones():
    s, e = student_and_engine()
    layout = [(n, tuple(t.shape)) for n, t in s.items()]
    assert fingerprint(cut_back(e, PACKED, layout)) == fingerprint(s.values())
    e["model.layers.0.self_attn.qkv_proj.weight"][9, 3] += 1e-3  # one weight of k that did not arrive
    assert fingerprint(cut_back(e, PACKED, layout)) != fingerprint(s.values())


def test_an_engine_tensor_that_cannot_hold_the_students_is_said_by_name():
    s, e = student_and_engine()
    layout = [(n, tuple(t.shape)) for n, t in s.items()]
    e["model.norm.weight"] = torch.zeros(0)  # packed away for a kernel: nothing left to read
    with pytest.raises(ValueError, match=r"model.norm.weight: the engine's is \(0,\), the student's \(8,\)"):
        cut_back(e, PACKED, layout)
    del e["model.layers.0.mlp.gate_up_proj.weight"]
    with pytest.raises(KeyError, match="gate_proj.weight: no tensor of the engine holds it"):
        cut_back(e, PACKED, layout)
