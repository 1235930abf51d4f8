"""This trainer side by side with TRL's GKDTrainer, on the same models, prompts and hyper-parameters.

Run: ``pip install -e ".[bench]" && python bench/bench_vs_trl.py [--steps 30] [--sizes tiny larger]``.
``--smoke`` (for CI): the tiny pair, 6 steps of 8 prompts, TRL and ``sync`` only; where TRL is not
installed, this trainer alone, said in one line.

For each model size the bench builds a Qwen2-architecture teacher/student pair that shares one
byte-level BPE tokenizer with a ChatML template (the teacher trained briefly on a toy chat task,
the student untrained), writes the prompts as verl's RL parquet (``prompt`` = chat messages), and
trains the student for the same number of steps three ways, one after the other on this machine:

- TRL: ``trl.experimental.gkd.GKDTrainer`` in one process (generation, teacher and training in
  turn), as its documentation runs it;
- this trainer with ``trainer.scheduler=sync`` and with ``one_step_off``: the real supervisor, Ray,
  two rollout workers, the teacher server and the student actor, weights synced every step.

Same hyper-parameters: fully on-policy (TRL's ``lmbda=1``), generalised JSD with beta 0.5 on the
full vocabulary (``teacher.topk`` = the vocabulary: our top-k plus tail buckets are then the
full distribution), sampling temperature 1 with top-k 0 and top-p 1, ``max_new_tokens``, prompts
per step, AdamW at a constant learning rate, gradients clipped at norm 1.

Measured: seconds per step (the median gap between steps after a warm-up), completion tokens
per second (the completion tokens of a step, EOS included, over its time), the wall time with
start-up, and the KL at the end. The KL is measured here, the same way for every student: greedy
completions of held-out prompts, forward KL(teacher || student) per completion token on the full
vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import records  # noqa: E402  (bench/records.py, beside this file)

from gkd_core.trainer import data  # noqa: E402  (found through ROOT, put on sys.path above)
from gkd_core.trainer import loss as L  # noqa: E402

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = "one two three four five six seven eight nine".split()
# (teacher hidden, teacher layers, student hidden, student layers)
SIZES = {"tiny": (96, 2, 48, 1), "larger": (256, 4, 256, 4)}


@dataclass
class Hyper:
    steps: int = 30
    batch: int = 32  # prompts per step, one optimizer step each
    max_new_tokens: int = 24
    temperature: float = 1.0
    beta: float = 0.5
    lr: float = 3e-3
    warmup: int = 5  # steps left out of the per-step median


def chat_pair(rnd: random.Random) -> tuple[str, str]:
    a, b = rnd.randint(1, 9), rnd.randint(1, 9)
    q = f"what is {WORDS[a - 1]} plus {WORDS[b - 1]}" + " please" * rnd.randint(0, 6) + "?"
    return q, f"{a} + {b} = {a + b}. the answer is {a + b}."


def build_pair(out: Path, size: str, n_train: int = 512, n_val: int = 64, teacher_steps: int = 200) -> dict:
    """Tokenizer, trained teacher, untrained student (Hugging Face folders) and verl parquet files."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    done = out / "pair.json"
    if done.exists():
        return json.loads(done.read_text())
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    rnd = random.Random(0)
    pairs = [chat_pair(rnd) for _ in range(n_train + n_val)]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator([f"user\n{q}\nassistant\n{a}" for q, a in pairs], trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  chat_template=CHATML)

    def make(hidden: int, layers: int):
        kw = dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True)
        return AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen2", **kw))

    th, tl, sh, sl = SIZES[size]
    teacher = make(th, tl)
    opt = torch.optim.AdamW(teacher.parameters(), lr=3e-3)
    texts = [tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                     tokenize=False) for q, a in pairs[:n_train]]
    for step in range(teacher_steps):
        batch = tok([texts[(step * 32 + i) % len(texts)] for i in range(32)], return_tensors="pt", padding=True)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        loss = teacher(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    tok.padding_side = "left"
    for name, m in (("teacher", teacher), ("student", make(sh, sl))):
        m.save_pretrained(out / name)
        tok.save_pretrained(out / name)

    def rows(part):
        return [{"data_source": "tiny_add", "prompt": [{"role": "user", "content": q}], "ability": "math",
                 "reward_model": {"style": "rule", "ground_truth": a}, "extra_info": {"index": i}}
                for i, (q, a) in enumerate(part)]
    pq.write_table(pa.Table.from_pylist(rows(pairs[:n_train])), out / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows(pairs[n_train:])), out / "val.parquet")
    info = {"dir": str(out), "teacher": str(out / "teacher"), "student": str(out / "student"),
            "train": str(out / "train.parquet"), "val": str(out / "val.parquet"), "vocab": len(tok),
            "teacher_loss": round(loss.item(), 3),
            "student_params": sum(p.numel()
                                  for p in AutoModelForCausalLM.from_pretrained(out / "student").parameters())}
    done.write_text(json.dumps(info))
    return info


# --- TRL --------------------------------------------------------------------------------------

def trl_child(pair: dict, hp: Hyper, out: Path) -> None:
    """Runs in its own process: TRL's GKDTrainer for hp.steps steps; writes timings and the student."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    completion_tokens: list[int] = []
    generate_s: list[float] = []

    class Counted(GKDTrainer):
        @staticmethod
        def generate_on_policy_outputs(model, inputs, generation_config):
            t = time.perf_counter()
            ids, mask, labels = GKDTrainer.generate_on_policy_outputs(model, inputs, generation_config)
            generate_s.append(time.perf_counter() - t)
            completion_tokens.append(int((labels != -100).sum()))  # EOS included, as in this trainer
            return ids, mask, labels

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kw):
            self.ends.append(time.perf_counter())

    tok = AutoTokenizer.from_pretrained(pair["student"])
    # the assistant turn is the collator's label; with lmbda 1 every step replaces it by a sample
    table = pq.read_table(pair["train"]).to_pylist()
    ds = datasets.Dataset.from_list([{"messages": r["prompt"] + [
        {"role": "assistant", "content": r["reward_model"]["ground_truth"]}]} for r in table])
    args = GKDConfig(
        output_dir=str(out / "trl"), max_steps=hp.steps, per_device_train_batch_size=hp.batch,
        gradient_accumulation_steps=1, learning_rate=hp.lr, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=1.0, lmbda=1.0, beta=hp.beta, temperature=hp.temperature,
        max_new_tokens=hp.max_new_tokens, seed=0, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0)
    clock = Clock()
    trainer = Counted(model=AutoModelForCausalLM.from_pretrained(pair["student"]),
                      teacher_model=AutoModelForCausalLM.from_pretrained(pair["teacher"]),
                      args=args, train_dataset=ds, processing_class=tok, callbacks=[clock])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    trainer.model.save_pretrained(out / "trl-student")
    tok.save_pretrained(out / "trl-student")
    gaps = [b - a for a, b in zip(clock.ends[hp.warmup:], clock.ends[hp.warmup + 1:], strict=False)]
    gen = statistics.median(generate_s[hp.warmup + 1:])
    (out / "trl.json").write_text(json.dumps({
        "step_s": statistics.median(gaps),
        "timing": {"generate": gen, "teacher+train": statistics.median(gaps) - gen},
        "tokens": completion_tokens[hp.warmup + 1:], "wall_s": wall,
        "student": str(out / "trl-student"), "threads": torch.get_num_threads()}))


def run_trl(pair: dict, hp: Hyper, out: Path, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--trl-child", json.dumps(pair), json.dumps(asdict(hp)), str(out)],
                   env=env, check=True, timeout=3600, stdout=subprocess.DEVNULL)
    r = json.loads((out / "trl.json").read_text())
    r["wall_s"] = time.perf_counter() - t0  # with the process's start, as for ours
    r["tok_per_step"] = statistics.mean(r.pop("tokens"))
    return r


# --- this trainer -----------------------------------------------------------------------------

def run_ours(pair: dict, hp: Hyper, scheduler: str, home: Path) -> dict:
    run_id = f"vs-trl-{scheduler}"
    shutil.rmtree(home / "runs" / run_id, ignore_errors=True)  # a kept folder's earlier run
    overrides = [
        f"model.path={pair['student']}", f"teacher.path={pair['teacher']}", f"data.files=[{pair['train']}]",
        f"data.val_files=[{pair['val']}]", f"data.batch_size={hp.batch}", f"actor.micro_batch_size={hp.batch}",
        f"rollout.max_new_tokens={hp.max_new_tokens}", f"rollout.temperature={hp.temperature}",
        f"actor.temperature={hp.temperature}", "actor.loss=jsd", f"actor.beta={hp.beta}", f"actor.lr={hp.lr}",
        "actor.max_grad_norm=1.0", f"teacher.topk={pair['vocab']}", f"trainer.total_steps={hp.steps}",
        f"trainer.scheduler={scheduler}", f"trainer.checkpoint_every={hp.steps}", "trainer.eval_every=0",
        "model.dtype=float32", "trainer.device=cpu"]
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gkd_core", "run", *overrides, "--run-id", run_id, "--quiet"],
                   env=dict(os.environ, GKD_HOME=str(home)), cwd=ROOT, check=True, timeout=3600)
    wall = time.perf_counter() - t0
    rd = home / "runs" / run_id
    metrics = [e for e in map(json.loads, (rd / "events.jsonl").read_text().splitlines()) if e["kind"] == "metrics"]
    # the last step also evaluates and saves: its gap is left out with the warm-up
    gaps = [b["ts"] - a["ts"] for a, b in zip(metrics[hp.warmup:-1], metrics[hp.warmup + 1:-1], strict=False)]
    timing = {k: statistics.median(m["timing"].get(k, 0.0) for m in metrics[hp.warmup:-1])
              for k in metrics[-1]["timing"] if k != "eval"}
    folder = sorted(rd.glob("checkpoints/step_*/**/config.json"))[-1].parent
    return {"step_s": statistics.median(gaps), "wall_s": wall, "student": str(folder), "timing": timing,
            "tok_per_step": statistics.mean(m["completion_len"] * hp.batch for m in metrics[hp.warmup + 1:-1])}


# --- the KL at the end, measured the same way for every student ----------------------------------

@torch.no_grad()
def held_out_kl(student_dir: str, pair: dict, max_new_tokens: int) -> float:
    """Forward KL(teacher || student) per completion token on the full vocabulary, on the student's
    greedy completions of the held-out prompts."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(pair["teacher"])
    student = AutoModelForCausalLM.from_pretrained(student_dir).eval()
    teacher = AutoModelForCausalLM.from_pretrained(pair["teacher"]).eval()
    rows = [tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=False)
            for r in pq.read_table(pair["val"]).to_pylist()]
    rows = [r["input_ids"] if hasattr(r, "keys") else r for r in rows]
    ids, pads = data.left_pad(rows, tok.pad_token_id)
    x = torch.as_tensor(ids, dtype=torch.long)
    mask, _ = L.attention(torch.as_tensor(pads, dtype=torch.long), x.shape[1])
    seqs = student.generate(x, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    attn, pos = L.attention(torch.as_tensor(pads, dtype=torch.long), seqs.shape[1])
    keep = L.completion_mask(seqs, x.shape[1], tok.eos_token_id)[:, 1:]
    t = F.log_softmax(teacher(input_ids=seqs, attention_mask=attn, position_ids=pos).logits[:, :-1].float(), -1)
    s = F.log_softmax(student(input_ids=seqs, attention_mask=attn, position_ids=pos).logits[:, :-1].float(), -1)
    kl = (t.exp() * (t - s)).sum(-1)
    return float((kl * keep).sum() / keep.sum().clamp(min=1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--sizes", nargs="+", default=["tiny", "larger"], choices=list(SIZES))
    p.add_argument("--trl-threads", type=int, default=os.cpu_count(),
                   help="torch threads of the TRL process (its default: every core)")
    p.add_argument("--keep", help="a folder for the models and runs (default: a temporary one)")
    p.add_argument("--trl-child", nargs=3, help=argparse.SUPPRESS)
    p.add_argument("--smoke", action="store_true", help="the tiny pair, 6 steps of 8 prompts, TRL and sync only: "
                                                        "for CI; without TRL, this trainer alone")
    a = p.parse_args()
    os.environ.update(HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error", TRL_EXPERIMENTAL_SILENCE="1")
    if a.trl_child:
        pair, hp, out = a.trl_child
        return trl_child(json.loads(pair), Hyper(**json.loads(hp)), Path(out))
    with_trl = records.other_half("trl", "this trainer", "TRL's GKDTrainer", "bench_vs_trl")
    if not with_trl:
        if not a.smoke:
            sys.exit('bench_vs_trl: TRL is not installed: pip install -e ".[bench]" '
                     "(or --smoke for this trainer alone)")
        print("bench_vs_trl: TRL is not installed (the bench extra): this trainer alone, no TRL row")
    schedulers = ("sync",) if a.smoke else ("sync", "one_step_off")
    pair_size = dict(n_train=64, n_val=8, teacher_steps=20) if a.smoke else {}
    if a.smoke:
        a.sizes = ["tiny"]

    with tempfile.TemporaryDirectory(prefix="gkd-vs-trl-") as tmp:
        work = Path(a.keep or tmp)
        lines = []
        for size in a.sizes:
            hp = Hyper(steps=a.steps, lr=3e-3 if size == "tiny" else 1e-3)
            if a.smoke:  # warm-up 2 of 6 steps: 2 gaps between the steps left (the last one evaluates and saves)
                hp = Hyper(steps=6, batch=8, max_new_tokens=8, warmup=2, lr=hp.lr)
            pair = build_pair(work / size / "models", size, **pair_size)
            out = work / size
            res = {"TRL GKDTrainer": run_trl(pair, hp, out, a.trl_threads)} if with_trl else {}
            for sched in schedulers:
                res[f"gkd-tui {sched}"] = run_ours(pair, hp, sched, out / f"home-{sched}")
            start_kl = held_out_kl(pair["student"], pair, hp.max_new_tokens)
            base = res.get("TRL GKDTrainer")
            lines.append(f"\n{size}: student {pair['student_params'] / 1e6:.2f} M parameters "
                         f"({SIZES[size][2]} hidden, {SIZES[size][3]} layers), teacher {SIZES[size][0]} hidden, "
                         f"{SIZES[size][1]} layers, vocabulary {pair['vocab']}; {hp.steps} steps of {hp.batch} "
                         f"prompts, {hp.max_new_tokens} new tokens, lr {hp.lr}; held-out KL at the start "
                         f"{start_kl:.3f}")
            lines.append(f"{'trainer':22s} {'s/step':>7s} {'compl. tok/s':>12s} {'vs TRL':>7s} {'wall s':>7s} "
                         f"{'final KL':>9s}  where a step's time goes (median s)")
            for name, r in res.items():
                r["tok_s"] = r["tok_per_step"] / r["step_s"]
                r["kl"] = held_out_kl(r["student"], pair, hp.max_new_tokens)
                phases = "  ".join(f"{k} {v:.3f}" for k, v in r["timing"].items())
                if "threads" in r:
                    phases += f"  (one process, {r['threads']} torch threads)"
                vs = f"{r['tok_s'] / base['tok_s']:6.2f}x" if base else f"{'-':>7s}"
                lines.append(f"{name:22s} {r['step_s']:7.3f} {r['tok_s']:12.0f} {vs} "
                             f"{r['wall_s']:7.1f} {r['kl']:9.3f}  {phases}")
            print("\n".join(lines[-len(res) - 2:]), flush=True)
    import transformers
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    if with_trl:
        import trl

        versions += f", trl {trl.__version__}"
    with records.kept("vs_trl", smoke=a.smoke):
        print("\n".join(["=== bench_vs_trl ==="] + lines))
        print(f"\n{os.cpu_count()} cores, {versions}")


if __name__ == "__main__":
    main()
