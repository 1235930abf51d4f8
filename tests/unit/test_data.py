"""Prompts from JSON lines, JSON and verl's RL parquet; the order and its position; left padding."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from gkd_core.trainer import data
from gkd_core.trainer import loss as L

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    """A real byte-level BPE tokenizer with a ChatML template, as a small chat model has."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(["what is two plus three? the answer is five."] * 20,
                           trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>",
                                                                                "<|im_end|>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)


def verl_parquet(path, questions):
    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "5"}, "extra_info": {"index": i}}
            for i, q in enumerate(questions)]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_verl_parquet_renders_with_the_chat_template(tmp_path, tok):
    verl_parquet(tmp_path / "train.parquet", ["what is two plus three?", "what is two?"])
    p = data.load_prompts([str(tmp_path / "train.parquet")], tok, "prompt", 1024, "drop")
    assert len(p.ids) == 2 and p.chat == 2
    want = tok.apply_chat_template([{"role": "user", "content": "what is two?"}], add_generation_prompt=True,
                                   tokenize=False)
    assert tok.decode(p.ids[1]) == want and want.endswith("<|im_start|>assistant\n")
    assert p.describe(1024) == "2 prompts from train.parquet (0 longer than 1024 dropped, 2 as chat)"


def test_strings_from_jsonl_and_json_and_overlong_ones(tmp_path, tok):
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"q": "two " * n}) + "\n" for n in (1, 2, 40)))
    (tmp_path / "b.json").write_text(json.dumps([{"q": "three"}, {"q": "five"}]))
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.json")]
    dropped = data.load_prompts(files, tok, "q", 10, "drop")
    assert len(dropped.ids) == 4 and dropped.dropped == 1 and dropped.read == 5
    cut = data.load_prompts(files, tok, "q", 10, "left")
    assert len(cut.ids) == 5 and cut.truncated == 1 and len(cut.ids[2]) == 10
    assert cut.ids[2] == tok("two " * 40)["input_ids"][-10:]  # the end of a prompt is what it asks
    with pytest.raises(data.DataError, match=r"a.jsonl, row 2: the prompt is \d+ tokens"):
        data.load_prompts(files, tok, "q", 10, "error")


@pytest.mark.parametrize("name, content, match", [
    ("x.csv", "prompt\nhi\n", "cannot read a '.csv' file"),
    ("x.jsonl", '{"text": "hi"}\n', r"no 'prompt' column \(data.prompt_key\); it has: text"),
    ("x.jsonl", '{"prompt": "hi"\n', "not readable as JSON lines"),
    ("x.json", '{"prompt": "hi"}', "must hold a list of objects"),
    ("x.jsonl", '{"prompt": 3}\n', "a prompt must be a string or a list"),
])
def test_bad_files_say_which_and_what_to_do(tmp_path, tok, name, content, match):
    (tmp_path / name).write_text(content)
    with pytest.raises(data.DataError, match=match):
        data.load_prompts([str(tmp_path / name)], tok, "prompt", 100, "drop")
    with pytest.raises(data.DataError, match="no such file"):
        data.load_prompts([str(tmp_path / "missing.parquet")], tok, "prompt", 100, "drop")


def test_order_is_a_new_permutation_every_epoch_and_resumes_where_it_stood():
    o = data.PromptOrder(n=10, seed=3)
    first = o.take(7) + o.take(3)
    second = o.take(10)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second and o.epoch == 2
    # a restart from position 13 with another batch size sees exactly what was next
    straight = data.PromptOrder(n=10, seed=3)
    straight.take(13)
    resumed = data.PromptOrder(n=10, seed=3, position=13)
    assert resumed.take(4) + resumed.take(4) == straight.take(8)


def test_hold_out_takes_a_fixed_tenth_at_most():
    p = data.Prompts(ids=[[i] for i in range(100)], files=["f"])
    held = data.hold_out(p, 64, seed=0)
    assert len(held) == 10 and len(p.ids) == 90 and not {h[0] for h in held} & {i[0] for i in p.ids}


def test_left_padding_masks_and_positions():
    ids, pads = data.left_pad([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]] and pads.tolist() == [0, 2]
    mask, pos = L.attention(torch.as_tensor(pads), 5)
    assert mask.tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    assert pos.tolist() == [[0, 1, 2, 3, 4], [0, 0, 0, 1, 2]]  # every row's first real token at 0
    seqs = torch.tensor([[5, 6, 7, 9, 2, 0], [0, 0, 8, 3, 4, 4]])
    assert L.completion_mask(seqs, 3, [2, 4]).tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 0]]
    assert ids.dtype == np.int32
