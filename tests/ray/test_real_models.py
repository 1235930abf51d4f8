"""Any Hugging Face causal LM and verl's parquet: left padding that changes nothing, tokenizers that
must agree, and a run on a tiny Qwen2 pair whose checkpoint loads and generates."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import ROOT, wait_until
from tiny_hf import WORDS, model, tokenizer

from gkd_core import config as config_mod
from gkd_core.trainer import data, inputs, models
from gkd_core.trainer import loss as L


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen2 teacher and student saved as Hugging Face folders, and verl's RL parquet."""
    root = tmp_path_factory.mktemp("tinyhf")
    tok = tokenizer()
    for name, hidden, seed in (("teacher", 64, 1), ("student", 32, 2)):
        model(tok, "qwen2", hidden, seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [{"data_source": "t",
             "prompt": [{"role": "user", "content": f"what is {a} plus {b}?" + " please" * (i % 4)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": b}, "extra_info": {"index": i}}
            for i, (a, b) in enumerate((a, b) for a in WORDS for b in WORDS)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    return root


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_left_padding_changes_no_logit_and_no_greedy_token(arch):
    tok = tokenizer()
    m = model(tok, arch, 32, 0) if arch != "gpt2" else _gpt2(tok)
    rows = [tok("what is one plus two?")["input_ids"], tok("two?")["input_ids"]]
    ids, pads = data.left_pad(rows, tok.pad_token_id)
    x = torch.as_tensor(ids, dtype=torch.long)
    mask, pos = L.attention(torch.as_tensor(pads, dtype=torch.long), x.shape[1])
    with torch.no_grad():
        batched = m(input_ids=x, attention_mask=mask, position_ids=pos).logits
        alone = m(input_ids=torch.tensor([rows[1]])).logits
        assert torch.allclose(batched[1, pads[1]:], alone[0], atol=1e-4)
        out = m.generate(x, attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        one = m.generate(torch.tensor([rows[1]]), max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out[1, ids.shape[1]:].tolist()[:one.shape[1] - len(rows[1])] == one[0, len(rows[1]):].tolist()


def _gpt2(tok):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=1, n_head=4)).eval()


def test_tokenizers_must_agree_before_anything_starts(pair, tmp_path):
    other = tmp_path / "other"
    model(tokenizer(extra="a different corpus entirely"), "qwen2", 32, 3).save_pretrained(other)
    tokenizer(extra="a different corpus entirely").save_pretrained(other)
    cfg = config_mod.load_config(None, [f"model.path={other}", f"teacher.path={pair / 'teacher'}",
                                        f"data.files=[{pair / 'train.parquet'}]"])
    with pytest.raises(data.DataError, match=r"the student's tokenizer \(.*other\) and the teacher's \(.*teacher\) "
                                             r"differ: token"):
        inputs.prepare(cfg, tmp_path)


def test_verl_parquet_and_held_out_prompts(pair, tmp_path):
    cfg = config_mod.load_config(None, [f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}",
                                        f"data.files=[{pair / 'train.parquet'}]", "data.eval_prompts=8"])
    got = inputs.prepare(cfg, tmp_path)
    assert got.said == "data: 81 prompts from train.parquet (0 longer than 1024 dropped, 81 as chat); " \
                       "8 of them held out for evaluation"
    assert len(got.train.ids) == 73 and len(got.val) == 8
    assert got.cfg.model.path == str(pair / "student") and got.pad_id == 0
    assert models.eos_ids(str(pair / "student"), models.load_tokenizer(pair / "student")) == [2]


@pytest.mark.slow
def test_a_qwen2_pair_trains_on_verl_parquet_and_its_checkpoint_generates(start_supervisor, pair):
    sup = start_supervisor(f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}",
                           f"data.files=[{pair / 'train.parquet'}]", "trainer.total_steps=6", "data.batch_size=8",
                           "trainer.eval_every=3", "rollout.max_new_tokens=8", "data.eval_prompts=8",
                           "trainer.checkpoint_every=3", driver="gkd_core.trainer.driver")
    assert sup.wait_exit(300) == 0
    events = sup.events()
    said = [e["message"] for e in events if e["kind"] == "log" and e["message"].startswith("data: ")]
    assert said and "81 prompts from train.parquet" in said[0]
    metrics = [e for e in events if e["kind"] == "metrics"]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4, 5, 6]
    assert [m["evaluated"] for m in metrics] == [False, False, True, False, False, True]
    for m in metrics:
        assert 0 < m["completion_len"] <= 8 and 0 <= m["eos_share"] <= 1 and 0 <= m["sample_agreement"] <= 1
        assert m["agreement"] is not None and m["eval_kl"] is not None and m["tokens_per_s"] > 0
    state = json.loads((sup.run / "checkpoints" / "step_000006" / "state.json").read_text())
    assert state["prompts_consumed"] == 48 and state["epoch"] == 0
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = sup.run / "checkpoints" / "step_000006"
    tok, m = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
    ids = tok.apply_chat_template([{"role": "user", "content": "what is two plus three?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert m.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]
    assert msgspec.yaml.decode((sup.run / "config.yaml").read_bytes())["model"]["path"] == str(pair / "student")


@pytest.mark.slow
def test_a_driver_killed_mid_epoch_resumes_with_the_next_unseen_prompt(start_supervisor, pair):
    sup = start_supervisor(f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}",
                           f"data.files=[{pair / 'train.parquet'}]", "trainer.total_steps=14", "data.batch_size=8",
                           "data.eval_prompts=8", "trainer.eval_every=0", "rollout.max_new_tokens=6",
                           "trainer.checkpoint_every=3", "--linger", "120", driver="gkd_core.trainer.driver")
    pid = sup.wait_driver(120)
    # 73 training prompts: the second epoch begins in step 10
    wait_until(lambda: any(e["kind"] == "metrics" and e["step"] >= 11 for e in sup.events()), 240, "step 11")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: any(e["kind"] == "run" and e["state"] == "failed" for e in sup.events()), 60, "the failure")
    with sup.client(timeout_s=5) as c:
        c.request("restart", {})
    wait_until(lambda: any(e["kind"] == "run" and e["state"] == "finished" for e in sup.events()), 240, "the end")
    events = sup.events()
    resumed = [re.search(r"resumed from checkpoints/step_0*(\d+) \(step \d+, prompt (\d+) of epoch (\d+)\)",
                         e["message"]) for e in events if e["kind"] == "log"]
    k, prompt, epoch = map(int, next(m for m in resumed if m).groups())
    assert k >= 9 and k % 3 == 0 and (prompt, epoch) == ((8 * k) % 73, (8 * k) // 73)
    newest = {}  # step -> its last metrics: steps after the checkpoint were done again by the new driver
    for e in events:
        if e["kind"] == "metrics":
            newest[e["step"]] = e
    assert sorted(newest) == list(range(1, 15))
    # each step took the next 8 prompts of the one order: nothing seen twice, nothing left out
    assert [newest[s]["data_position"] for s in range(1, 15)] == [8 * s for s in range(1, 15)]
    assert newest[14]["epoch"] == round(112 / 73, 4)


@pytest.mark.slow
def test_bad_inputs_are_refused_in_seconds_before_any_worker_starts(pair, gkd_home, tmp_path):
    other = tmp_path / "other"
    tokenizer(extra="a different corpus entirely").save_pretrained(other)
    model(tokenizer(extra="a different corpus entirely"), "qwen2", 32, 3).save_pretrained(other)
    (tmp_path / "text.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "long.jsonl").write_text('{"prompt": "what is one plus two? please please"}\n')
    models_ok = [f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}"]
    cases = [
        ([f"model.path={other}", f"teacher.path={pair / 'teacher'}", f"data.files=[{pair / 'train.parquet'}]"],
         r"the student's tokenizer \(.*other\) and the teacher's \(.*teacher\) differ: token"),
        ([*models_ok, f"data.files=[{tmp_path / 'missing.parquet'}]"], r"missing.parquet: no such file"),
        ([*models_ok, f"data.files=[{tmp_path / 'text.jsonl'}]"], r"text.jsonl: no 'prompt' column .*it has: text"),
        ([*models_ok, f"data.files=[{tmp_path / 'empty.jsonl'}]"], r"empty.jsonl: the file is empty"),
        ([*models_ok, f"data.files=[{tmp_path / 'long.jsonl'}]", "data.max_prompt_length=4"],
         r"no prompts left in .*long.jsonl: 1 read, 1 longer than data.max_prompt_length=4"),
    ]
    for args, said in cases:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gkd_core", "run", *args], cwd=ROOT, capture_output=True,
                             text=True, timeout=120)
        took = time.monotonic() - t0
        assert out.returncode == 2, out.stderr
        last = out.stderr.strip().splitlines()[-1]
        assert re.search(said, last), last
        # refused at the command's start-up cost (Python, torch, the tokenizers read: 2 to 3 s here), before
        # any worker: ray.init alone takes about 7 s on this machine, so a worker started would pass 10
        assert "Traceback" not in out.stderr and took < 10, took
        run = sorted((gkd_home / "runs").glob("2*"))[-1]
        assert not any(b'"kind":"worker"' in line and b'"src":"driver"' not in line
                       for line in (run / "events.jsonl").read_bytes().splitlines())  # no worker started
