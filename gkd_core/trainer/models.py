"""The built-in student and teacher, stored and loaded the way a real Hugging Face model is.

The teacher is prepared once by short supervised training on the task and cached under
``$GKD_HOME/cache/``; later launches load it at once. Both go through ``save_pretrained`` /
``from_pretrained`` with a tokenizer file, so a real model folder takes the same path.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path

import torch

from gkd_core.trainer import task

TEACHER_RECIPE = {"n_layer": 2, "n_embd": 128, "n_head": 4, "steps": 200, "batch": 64, "lr": 3e-3, "seed": 1}


def gpt2_config(n_layer: int, n_embd: int, n_head: int):
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=len(task.VOCAB), n_positions=64, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
        bos_token_id=task.VOCAB.index("<bos>"), eos_token_id=task.VOCAB.index("<eos>"),
        pad_token_id=task.VOCAB.index("<pad>"), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )


def encode_examples(tok, examples: list[task.Example], with_answer: bool) -> torch.Tensor:
    rows = []
    for ex in examples:
        words = ex.prompt + (ex.answer + ["<eos>"] if with_answer else [])
        rows.append(tok.convert_tokens_to_ids(words))
    return torch.tensor(rows, dtype=torch.long)


def _train_teacher(folder: Path, log=print) -> float:
    from transformers import GPT2LMHeadModel

    r = TEACHER_RECIPE
    torch.manual_seed(r["seed"])
    tok = task.build_tokenizer(folder)
    model = GPT2LMHeadModel(gpt2_config(r["n_layer"], r["n_embd"], r["n_head"]))
    opt = torch.optim.AdamW(model.parameters(), lr=r["lr"])
    rnd = random.Random(r["seed"])
    t0 = time.time()
    for step in range(r["steps"]):
        ids = encode_examples(tok, [task.make_example(rnd) for _ in range(r["batch"])], with_answer=True)
        labels = ids.clone()
        labels[:, : task.PROMPT_LEN] = -100  # learn the answer, not the prompt
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            log(f"teacher: step {step}/{r['steps']} loss {loss.item():.3f}")
    acc = answer_accuracy(model, tok, task.prompts(seed=12345, n=256))
    log(f"teacher: trained in {time.time() - t0:.1f} s, answer accuracy {acc:.3f}")
    model.save_pretrained(str(folder))
    (folder / "gkd_teacher.json").write_text(json.dumps({"recipe": r, "accuracy": acc}))
    return acc


@torch.no_grad()
def answer_accuracy(model, tok, examples: list[task.Example]) -> float:
    ids = encode_examples(tok, examples, with_answer=True)
    logits = model(input_ids=ids).logits
    pred = logits[:, task.PROMPT_LEN - 1 : -1].argmax(-1)
    gold = ids[:, task.PROMPT_LEN :]
    return (pred == gold).float().mean().item()


def teacher_dir(home: Path) -> Path:
    digest = hashlib.sha256(json.dumps(TEACHER_RECIPE, sort_keys=True).encode()).hexdigest()[:10]
    return home / "cache" / f"tiny-teacher-{digest}"


def prepare_teacher(home: Path, log=print) -> Path:
    """The cached built-in teacher, trained first if it is not there (atomically, so two runs
    starting together neither corrupt it nor train it twice for long)."""
    final = teacher_dir(home)
    if (final / "gkd_teacher.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _train_teacher(tmp, log)
    try:
        os.rename(tmp, final)
    except OSError:  # another run won the race; use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu"):
    from transformers import AutoTokenizer, GPT2LMHeadModel, AutoModelForCausalLM

    tok = AutoTokenizer.from_pretrained(str(path))
    cls = GPT2LMHeadModel if (Path(path) / "gkd_teacher.json").exists() else AutoModelForCausalLM
    model = cls.from_pretrained(str(path), dtype=getattr(torch, dtype))
    return model.to(device), tok


def new_student(cfg_model, seed: int, tok_dir: Path):
    """The untrained built-in student (its tokenizer is the teacher's)."""
    from transformers import AutoTokenizer, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config(cfg_model.n_layer, cfg_model.n_embd, cfg_model.n_head))
    return model, AutoTokenizer.from_pretrained(str(tok_dir))
