"""The two rollout engines side by side: tokens/s of generation, and the step time of a GKD run with each.

    .venv-vllm/bin/python bench/bench_engines.py [--rounds 5] [--prompts 32] [--new 48] [--steps 20]
    python bench/bench_engines.py --smoke   # for CI: one round of 4 prompts, 8 new tokens, 5 steps

Run in a venv with vLLM (docs/development.md: ``.venv-vllm``). One tiny Qwen2 student (hidden 256, 4 layers, heads of
32: vLLM's CPU attention takes no smaller) and a teacher twice its width, saved as Hugging Face folders,
with verl's RL parquet:

- **generation**: the same left-padded chat prompts, greedy, ``--new`` tokens at most, through the torch
  engine (Hugging Face ``generate`` on the model, as a rollout worker does) and through ``vllm.LLM``
  (``VllmEngine``); the two alternate round by round in this one process; tokens/s is the completion
  tokens made over the wall time of the call, median (min-max) of the rounds. Also whether the two gave
  the same tokens.
- **teacher scoring**: the top-16 log-probs at every position of those prompts with a completion, by the
  teacher through Hugging Face torch (``torch_engine.score``) and through vLLM's ``prompt_logprobs``
  (``VllmScorer``), alternating round by round; tokens scored a second, and the largest difference of
  a log-prob between the two.
- **a GKD step**: ``gkd_core run`` of ``--steps`` steps with ``rollout.engine=torch``, then ``vllm``,
  through the real supervisor and trainer; the median gap between steps after a warm-up, and the median
  of the step's generation and sync phases.

``--smoke`` runs the same three on the smallest sizes; in a venv without vLLM it runs the torch engine's
half alone and says so (the table then has no vLLM rows).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import records  # noqa: E402  (bench/records.py, beside this file)


def build(root: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tiny_hf import WORDS, model, tokenizer

    tok = tokenizer()
    for name, hidden, heads in (("teacher", 512, 16), ("student", 256, 8)):
        model(tok, "qwen2", hidden, seed=1, heads=heads, layers=4).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [{"data_source": "t",
             "prompt": [{"role": "user", "content": f"what is {a} plus {b}?" + " please" * (i % 5)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": b}, "extra_info": {"index": i}}
            for i, (a, b) in enumerate((a, b) for a in WORDS for b in WORDS)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")


def generation(root: Path, rounds: int, n_prompts: int, new: int, engines: tuple[str, ...]) -> dict:
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gkd_core.trainer import data, torch_engine

    folder = root / "student"
    tok = AutoTokenizer.from_pretrained(folder)
    rows = [tok.apply_chat_template([{"role": "user", "content": f"what is {i} plus {i % 7}?" + " please" * (i % 5)}],
                                    add_generation_prompt=True, tokenize=True) for i in range(n_prompts)]
    ids, pads = data.left_pad([r["input_ids"] if hasattr(r, "keys") else r for r in rows], tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ways = {"torch": lambda: torch_engine.generate(model, ids, pads, eos_ids=[tok.eos_token_id],
                                                   pad_id=tok.pad_token_id, max_new_tokens=new, temperature=0.0,
                                                   seed=0)}
    eng = None
    if "vllm" in engines:
        from gkd_core.trainer.vllm_engine import VllmEngine

        eng = VllmEngine(str(folder), gpu_memory_utilization=0.5, dtype="float32", eos_ids=[tok.eos_token_id],
                         pad_id=tok.pad_token_id, max_model_len=128)
        ways["vllm"] = lambda: eng.generate(ids, pads, temperature=0.0, max_new_tokens=new, seed=0)

    def made(out: np.ndarray) -> int:
        tail = out[:, ids.shape[1]:]
        return int(sum(next((i + 1 for i, t in enumerate(r) if t == tok.eos_token_id), len(r)) for r in tail))

    res: dict[str, list[float]] = {w: [] for w in ways}
    outs = {}
    for w in ways:
        ways[w]()  # a warm-up call each (vLLM's first batch builds its caches)
    for r in range(rounds):
        for w in (ways if r % 2 == 0 else reversed(list(ways))):
            t0 = time.perf_counter()
            outs[w] = ways[w]()
            res[w].append(made(outs[w]) / (time.perf_counter() - t0))
    if eng is None:
        return {"tokens_per_s": res, "same_tokens": None}
    eng.close()
    a, b = outs["torch"], outs["vllm"]
    same = a.shape == b.shape and bool((a == b).all())
    return {"tokens_per_s": res, "same_tokens": same}


def scoring(root: Path, rounds: int, n_prompts: int, engines: tuple[str, ...], k: int = 16) -> dict:
    import numpy as np
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gkd_core.trainer import data, torch_engine

    folder = root / "teacher"
    tok = AutoTokenizer.from_pretrained(folder)
    rows = [tok.apply_chat_template([{"role": "user", "content": f"what is {i} plus {i % 7}?" + " please" * (i % 5)}],
                                    add_generation_prompt=True, tokenize=True) for i in range(n_prompts)]
    rows = [(r["input_ids"] if hasattr(r, "keys") else r) + [(i * 7 + j) % 200 + 10 for j in range(24)]
            for i, r in enumerate(rows)]  # and a completion of 24 tokens
    ids, pads = data.left_pad(rows, tok.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ways = {"torch": lambda: torch_engine.score(model, ids, k, pads)}
    scorer = None
    if "vllm" in engines:
        from gkd_core.trainer.vllm_teacher import VllmScorer

        scorer = VllmScorer(str(folder), topk=k, max_model_len=128)
        ways["vllm"] = lambda: scorer.score(ids, k, pads)
    n_tokens = int(sum(len(r) for r in rows))
    res: dict[str, list[float]] = {w: [] for w in ways}
    outs = {}
    for w in ways:
        ways[w]()
    for r in range(rounds):
        for w in (ways if r % 2 == 0 else reversed(list(ways))):
            t0 = time.perf_counter()
            outs[w] = ways[w]()
            res[w].append(n_tokens / (time.perf_counter() - t0))
    if scorer is None:
        return {"tokens_per_s": res, "max_logp_diff": None}
    scorer.close()
    real = np.arange(ids.shape[1])[None, :] >= pads[:, None]
    diff = float(np.abs(outs["torch"][1] - outs["vllm"][1])[real].max())
    return {"tokens_per_s": res, "max_logp_diff": diff}


def gkd_run(home: Path, root: Path, engine: str, steps: int) -> dict:
    env = dict(os.environ, GKD_HOME=str(home), VLLM_CPU_KVCACHE_SPACE="1")
    run_id = f"bench-{engine}"
    subprocess.run([sys.executable, "-m", "gkd_core", "run", f"model.path={root / 'student'}",
                    f"teacher.path={root / 'teacher'}", f"data.files=[{root / 'train.parquet'}]",
                    f"rollout.engine={engine}", f"trainer.total_steps={steps}", "trainer.checkpoint_every=1000",
                    "trainer.eval_every=0", "data.batch_size=8", "rollout.max_new_tokens=32", "--run-id", run_id,
                    "--quiet"], env=env, cwd=ROOT, check=True, timeout=1800)
    events = [json.loads(line) for line in (home / "runs" / run_id / "events.jsonl").read_text().splitlines()]
    metrics = [e for e in events if e["kind"] == "metrics"]
    warm = max(3, steps // 5)
    gaps = [b["ts"] - a["ts"] for a, b in zip(metrics[warm:], metrics[warm + 1:], strict=False)]
    return {"step_s": statistics.median(gaps),
            **{k: statistics.median(m["timing"].get(k, 0.0) for m in metrics[warm:])
               for k in ("generate", "wait", "sync")}}


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.0f} ({min(xs):.0f}-{max(xs):.0f})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--new", type=int, default=48)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--smoke", action="store_true", help="one round of 4 prompts, 8 new tokens, 5 steps: for CI; "
                                                        "without vLLM, the torch engine alone")
    a = p.parse_args()
    engines: tuple[str, ...] = ("torch", "vllm")
    if not records.other_half("vllm", "the torch engine", "vLLM", "bench_engines"):
        if not a.smoke:
            sys.exit("bench_engines: vLLM is not installed in this venv; run it with .venv-vllm/bin/python "
                     "(docs/development.md), or --smoke for the torch engine alone")
        print("bench_engines: vLLM is not installed in this venv: the torch engine alone, no vLLM rows")
        engines = ("torch",)
    if a.smoke:
        a.rounds, a.prompts, a.new, a.steps = 1, 4, 8, 5  # 5 steps: a step-to-step gap after the warm-up (3)
    with tempfile.TemporaryDirectory(prefix="gkd-bench-") as tmp:
        root = Path(tmp)
        build(root)
        gen = generation(root, a.rounds, a.prompts, a.new, engines)
        score = scoring(root, a.rounds, a.prompts, engines)
        runs = {e: gkd_run(root / "home", root, e, a.steps) for e in engines}
    with records.kept("engines", smoke=a.smoke) as kept_run:
        tps = gen["tokens_per_s"]
        base = statistics.median(tps["torch"])
        print(f"generation: {a.prompts} prompts, greedy, up to {a.new} new tokens; {a.rounds} rounds, median (min-max)")
        print(f"{'engine':8s} {'tokens/s':>18s} {'vs torch':>9s}")
        for w, xs in tps.items():
            print(f"{w:8s} {spread(xs):>18s} {statistics.median(xs) / base:8.2f}x")
        if gen["same_tokens"] is not None:
            print(f"same tokens from both: {'yes' if gen['same_tokens'] else 'NO'}")
        tps = score["tokens_per_s"]
        base = statistics.median(tps["torch"])
        print(f"\nteacher scoring: the {a.prompts} prompts with 24 completion tokens each, top-16 at every position; "
              f"{a.rounds} rounds, median (min-max)")
        print(f"{'engine':8s} {'tokens/s':>18s} {'vs torch':>9s}")
        for w, xs in tps.items():
            print(f"{w:8s} {spread(xs):>18s} {statistics.median(xs) / base:8.2f}x")
        if score["max_logp_diff"] is not None:
            print(f"largest log-prob difference between the two: {score['max_logp_diff']:.2e}")
        print(f"\nGKD step ({a.steps} steps each, batch 8, 32 new tokens; median after a warm-up)")
        # the next batch is generated while the student trains: the step waits for it in "generate" (its start)
        # and "wait" (its end, before the sync)
        print(f"{'engine':8s} {'s/step':>8s} {'vs torch':>9s} {'waits on generation s':>22s} {'sync s':>8s}")
        for e, r in runs.items():
            print(f"{e:8s} {r['step_s']:8.3f} {r['step_s'] / runs['torch']['step_s']:8.2f}x "
                  f"{r['generate'] + r['wait']:22.3f} {r['sync']:8.3f}")
        print(f"\n{os.cpu_count()} cores, Python {sys.version.split()[0]}")
        if "vllm" in engines:
            kept_run.figure("generation, vLLM against torch", statistics.median(gen["tokens_per_s"]["vllm"])
                            / statistics.median(gen["tokens_per_s"]["torch"]), "x")
            kept_run.figure("teacher scoring, vLLM against torch", statistics.median(score["tokens_per_s"]["vllm"])
                            / statistics.median(score["tokens_per_s"]["torch"]), "x")
            kept_run.figure("a GKD step, vLLM against torch", runs["vllm"]["step_s"] / runs["torch"]["step_s"], "x")
    if gen["same_tokens"] is False:
        sys.exit("bench_engines: vLLM's greedy tokens differ from the torch engine's for the same weights "
                 "(tests/on_vllm/test_vllm_engine.py checks the same)")


if __name__ == "__main__":
    main()
