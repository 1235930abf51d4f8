"""Tiny real Hugging Face models and a BPE tokenizer with a ChatML template, made in a second on the CPU:
shared by the real-model tests (tests/ray/test_real_models.py) and vLLM's (tests/on_vllm)."""

from __future__ import annotations

import torch

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = "one two three four five six seven eight nine".split()


def tokenizer(extra: str = ""):
    from tokenizers import Tokenizer, decoders, pre_tokenizers, trainers
    from tokenizers import models as tm
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(tm.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    corpus = [f"user\nwhat is {a} plus {b}?\nassistant\nit is {b}." for a in WORDS for b in WORDS] + [extra] * 5
    tk.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=260 if not extra else 300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHATML)


def model(tok, arch: str, hidden: int, seed: int, heads: int = 4, layers: int = 1):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    kw = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), max_position_embeddings=128,
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **kw)).eval()
