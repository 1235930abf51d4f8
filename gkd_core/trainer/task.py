"""The built-in synthetic task, learnable by a tiny causal LM in seconds on a CPU.

A prompt ``<bos> k3 7 1 4 >`` asks for a chain that starts after the last digit and steps by
k modulo 10: ``7 0 3 6 9 2 <eos>``. Each answer token depends only on k and the token before
it, so the teacher's distribution is meaningful on any prefix the student samples (which is
what on-policy distillation feeds it), and a student that learns the rule agrees with the
teacher everywhere.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

DIGITS = [str(d) for d in range(10)]
STEPS = [f"k{k}" for k in range(1, 5)]
SPECIAL = ["<pad>", "<eos>", "<bos>", ">"]
VOCAB = SPECIAL + DIGITS + STEPS
PROMPT_DIGITS = 3
ANSWER_LEN = 6
PROMPT_LEN = 1 + 1 + PROMPT_DIGITS + 1  # <bos> k d d d >


@dataclass(frozen=True)
class Example:
    prompt: list[str]
    answer: list[str]  # without <eos>


def make_example(rnd: random.Random) -> Example:
    k = rnd.randint(1, 4)
    digits = [rnd.randrange(10) for _ in range(PROMPT_DIGITS)]
    answer, cur = [], digits[-1]
    for _ in range(ANSWER_LEN):
        cur = (cur + k) % 10
        answer.append(str(cur))
    return Example(["<bos>", f"k{k}", *map(str, digits), ">"], answer)


def prompts(seed: int, n: int, offset: int = 0) -> list[Example]:
    """``n`` examples of the stream ``seed`` starting at position ``offset`` (the data position)."""
    rnd = random.Random(f"{seed}:{offset}")
    return [make_example(rnd) for _ in range(n)]


def build_tokenizer(folder: Path):
    """A real tokenizer file (WordLevel, whitespace), saved the way a Hugging Face model's is."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>")
    fast.save_pretrained(str(folder))
    return fast


SPEC = {"task": "chain", "steps": STEPS, "digits": PROMPT_DIGITS, "answer": ANSWER_LEN, "version": 1}


def split_prompts(n_val: int) -> tuple[list[list[str]], list[list[str]]]:
    """Every distinct prompt of the task (4 steps x 1,000 digit triples), in a fixed random order:
    (training prompts, the ``n_val`` held out for evaluation)."""
    every = [["<bos>", k, *f"{d:03d}", ">"] for k in STEPS for d in range(10 ** PROMPT_DIGITS)]
    random.Random(0).shuffle(every)
    return every[n_val:], every[:n_val]
