"""Models by folder, and the built-in demo written out as the files a real run has.

Every run loads its student and teacher with ``from_pretrained`` from a folder and reads its
prompts from data files. With no ``model.path``, ``teacher.path`` or ``data.files``, the
built-in tiny demo stands in: a teacher prepared once by short supervised training on the
synthetic task, an untrained student, and the task's prompts as JSON lines, all cached under
``$GKD_HOME/cache/``, and from there on the same code as any Hugging Face model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

import torch

from gkd_core.trainer import task


class TeacherRecipe(TypedDict):
    n_layer: int
    n_embd: int
    n_head: int
    steps: int
    batch: int
    lr: float
    seed: int


TEACHER_RECIPE: TeacherRecipe = {"n_layer": 2, "n_embd": 128, "n_head": 4, "steps": 200, "batch": 64, "lr": 3e-3,
                                 "seed": 1}


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
    """The cached built-in teacher, trained first if it is not there."""
    return _atomic_folder(teacher_dir(home), lambda tmp: _train_teacher(tmp, log))


def load_model(path: str | Path, dtype: str = "float32", device: str = "cpu", trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code)
    # (transformers wraps .to with functools.wraps, whose typed wrapper binds no self)
    return model.to(device), tok  # type: ignore[arg-type]


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)


def eos_ids(model_or_path, tok) -> list[int]:
    """Every id that ends a completion: the generation config's (one or several) and the tokenizer's."""
    gen = getattr(model_or_path, "generation_config", None)
    if gen is None:
        from transformers import GenerationConfig

        try:
            gen = GenerationConfig.from_pretrained(str(model_or_path))
        except OSError:  # a folder without generation_config.json
            gen = None
    ids = getattr(gen, "eos_token_id", None) if gen is not None else None
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tok.eos_token_id is not None and tok.eos_token_id not in ids:
        ids.append(tok.eos_token_id)
    return ids


def pad_id(tok, eos: list[int]) -> int:
    """The tokenizer's pad id, or its first EOS (many causal LMs have no pad token)."""
    return tok.pad_token_id if tok.pad_token_id is not None else eos[0]


def first_difference(a, b) -> str:
    """'' when two tokenizers give every token the same id, else the first difference, in words."""
    va, vb = a.get_vocab(), b.get_vocab()
    for tok in sorted(set(va) | set(vb), key=lambda t: (min(va.get(t, 1 << 30), vb.get(t, 1 << 30)), t)):
        if va.get(tok) != vb.get(tok):
            return (f"token {tok!r} is id {va.get(tok, 'absent')} in the student's "
                    f"and {vb.get(tok, 'absent')} in the teacher's")
    return ""


@dataclass(frozen=True)
class Demo:
    teacher: Path
    student: Path
    train: Path
    val: Path


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:10]


def _atomic_folder(final: Path, fill) -> Path:
    """``final``, made by ``fill(tmp)`` in a temporary folder renamed into place: two runs starting
    together neither corrupt it nor see it half written."""
    if final.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    fill(tmp)
    try:
        os.rename(tmp, final)
    except OSError:  # another run won the race; use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def prepare_demo(home: Path, cfg_model, log=print) -> Demo:
    """The built-in demo's folders and files (made once, then cached)."""
    teacher = prepare_teacher(home, log)
    arch = {"n_layer": cfg_model.n_layer, "n_embd": cfg_model.n_embd, "n_head": cfg_model.n_head, "seed": 0,
            "teacher": teacher.name}

    def student(folder: Path) -> None:
        from transformers import AutoTokenizer, GPT2LMHeadModel

        torch.manual_seed(0)
        GPT2LMHeadModel(gpt2_config(cfg_model.n_layer, cfg_model.n_embd, cfg_model.n_head)).save_pretrained(str(folder))
        AutoTokenizer.from_pretrained(str(teacher)).save_pretrained(str(folder))

    def prompts(folder: Path) -> None:
        train, val = task.split_prompts(n_val=VAL_PROMPTS)
        for name, rows in (("train.jsonl", train), ("val.jsonl", val)):
            (folder / name).write_text("".join(json.dumps({"prompt": " ".join(p)}) + "\n" for p in rows))

    cache = home / "cache"
    data = _atomic_folder(cache / f"tiny-task-{_digest(task.SPEC)}", prompts)
    return Demo(teacher=teacher, student=_atomic_folder(cache / f"tiny-student-{_digest(arch)}", student),
                train=data / "train.jsonl", val=data / "val.jsonl")


VAL_PROMPTS = 64
