"""A GKD run whose rollouts generate with vLLM: every sync's fingerprint read from the engines' own
weights equals the student's, and a weight push skipped on purpose is named by the next check."""

from __future__ import annotations

import os
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import needs, wait_until

needs("vllm", "GKD_REQUIRE_VLLM", ".venv-vllm")  # CI runs these in .venv-vllm, where a missing vLLM fails

# the imports below come after needs(), which skips this module where vLLM is missing
from tiny_hf import WORDS, tokenizer  # noqa: E402
from tiny_hf import model as tiny_model  # noqa: E402

pytestmark = pytest.mark.slow
TRAINER = "gkd_core.trainer.driver"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny Qwen2 teacher and student with heads of 32 (vLLM's CPU attention takes no smaller), and verl's
    RL parquet."""
    root = tmp_path_factory.mktemp("tinyhf32")
    tok = tokenizer()
    for name, hidden, heads, seed in (("teacher", 128, 4, 1), ("student", 64, 2, 2)):
        tiny_model(tok, "qwen2", hidden, seed, heads=heads, layers=2).save_pretrained(root / name)
        tok.save_pretrained(root / name)
    rows = [{"data_source": "t", "prompt": [{"role": "user", "content": f"what is {a} plus {b}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": b}, "extra_info": {"index": i}}
            for i, (a, b) in enumerate((a, b) for a in WORDS for b in WORDS)]
    pq.write_table(pa.Table.from_pylist(rows), root / "train.parquet")
    return root


RUN_S = 600  # the 20 steps on vLLM: about 180 s alone here, more beside the verl tier (CI runs both)


@pytest.mark.timeout(RUN_S + 60)  # the suite's 300 s is for a test of ours; this one's bound is the run's
def test_a_20_step_run_on_vllm_checks_each_sync_in_the_engines_and_names_a_push_that_did_not_land(
        start_supervisor, pair):
    """Rollouts and teacher on vLLM: the syncs checked in the rollouts' engines, the teacher's counts adding up."""
    sup = start_supervisor(f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}",
                           f"data.files=[{pair / 'train.parquet'}]", "rollout.engine=vllm", "teacher.engine=vllm",
                           "trainer.total_steps=20",
                           "data.batch_size=8", "data.eval_prompts=8", "trainer.eval_every=10",
                           "rollout.max_new_tokens=8", "trainer.checkpoint_every=100",
                           "faults=[{kind: skip_weight_push, target: rollout/1, step: 12}, "
                           "{kind: slow_sync_part, target: rollout/0, step: 16, part: load, seconds: 10}]",
                           driver=TRAINER, VLLM_CPU_KVCACHE_SPACE="1")
    assert sup.wait_exit(RUN_S) == 0, sup.events()[-5:]
    events = sup.events()
    assert [e["step"] for e in events if e["kind"] == "metrics"] == list(range(1, 21))
    syncs = [e for e in events if e["kind"] == "sync" and e["state"] == "done"]
    # one sync before step 1 (step 0) and one after each step, the last's too (an evaluation follows it)
    assert [e["step"] for e in syncs] == list(range(0, 21))
    done = {e["step"]: e for e in syncs}
    # every sync compared the engines' weights with the student's, and found them equal, but the sync of step 12,
    # whose push into rollout/1's engine the fault skipped: compared too, and found to differ there alone
    assert {s: e.get("fingerprint_ok") for s, e in done.items() if s != 12} == {s: True for s in done if s != 12}
    assert done[12].get("fingerprint_ok") is False and done[12]["differ"] == ["rollout/1"], done[12]
    # critical while the mismatch is the newest sync's, then a warning once the next one matched (the two
    # may fall between the supervisor's looks: then only the warning is said)
    alerts = [e for e in events
              if e["kind"] == "alert" and e["code"] == "fingerprint_mismatch" and not e.get("cleared")]
    assert alerts and alerts[-1]["severity"] == "warn" and "(the syncs since matched)" in alerts[-1]["message"]
    for alert in alerts:
        assert alert["targets"] == ["rollout/1"], alert
        assert alert["message"].startswith("after sync ")
        assert "(step 12) rollout/1: its weights differ" in alert["message"]
    said = [e["message"] for e in events if e["kind"] == "log" and "fault injected" in e["message"]]
    assert said[0] == "fault injected: rollout/1 keeps the weights of the sync before in its vllm engine (step 12)"
    assert len(said) == 2
    assert said[1].startswith("fault injected: rollout/0 takes 10 s longer in the load part of sync ")
    # the push into rollout/0's engine after step 16, 10 s longer inside vLLM's own worker: that part of that sync
    # named with its usual time, the other parts of the push (the cache's reset, the read-back) said apart
    slow = [e for e in events if e["kind"] == "alert" and e["code"] == "sync_part_slow" and not e.get("cleared")]
    assert slow and slow[0]["targets"] == ["rollout/0"] and " (step 16): load into the engine " in slow[0]["message"]
    assert "usually " in slow[0]["message"], slow[0]["message"]
    assert {e["part"] for e in events if e["kind"] == "sync_part" and e["src"] == "rollout/0"} == {
        "broadcast", "load", "reset_cache", "verify"}
    inits = [e for e in events
             if e["kind"] == "phase" and e["src"].startswith("rollout/") and e["phase"] == "init_engine"]
    assert {e["src"] for e in inits} == {"rollout/0", "rollout/1"}
    # the teacher, scored by vLLM: every request sent was received, served and answered, none failed
    client = [e for e in events if e["kind"] == "teacher" and e["side"] == "client"][-1]
    server = [e for e in events if e["kind"] == "teacher" and e["side"] == "server"][-1]
    assert client["sent"] == client["completed"] == server["received"] == server["served"] > 0, (client, server)
    assert client["failed"] == 0 and sum(server["workers"].values()) == server["served"]
    assert any(e["kind"] == "phase" and e["src"] == "teacher/0" and "(engine vllm)" in e.get("detail", "")
               for e in events)
    # each engine's own counts reached the record: tokens generated only grow
    for src in ("rollout/0", "rollout/1", "teacher/0"):
        counts = [e["generated"] for e in events if e["kind"] == "engine" and e["src"] == src]
        assert counts and counts == sorted(counts) and counts[-1] > 0, (src, counts)


def test_a_frozen_engine_core_is_named_as_its_rollout_worker_stuck_in_its_next_engine_call(start_supervisor, pair):
    """vLLM runs its engine in a child process of the rollout worker (EngineCore): frozen, the worker waits
    on it in its next engine call, and the run names the worker, as it would a hang in the torch engine."""
    sup = start_supervisor(f"model.path={pair / 'student'}", f"teacher.path={pair / 'teacher'}",
                           f"data.files=[{pair / 'train.parquet'}]", "rollout.engine=vllm", "trainer.total_steps=200",
                           "data.batch_size=8", "data.eval_prompts=8", "trainer.eval_every=0",
                           "rollout.max_new_tokens=8", "trainer.checkpoint_every=100", "--linger", "30",
                           driver=TRAINER, VLLM_CPU_KVCACHE_SPACE="1")
    wait_until(lambda: any(e["kind"] == "metrics" and e["step"] >= 3 for e in sup.events()), 300, "step 3")
    worker = next(e["pid"] for e in sup.events() if e["kind"] == "worker" and e["src"] == "rollout/1")
    import psutil  # (vLLM's; not in the main venv)

    cores = [p.pid for p in psutil.Process(worker).children(recursive=True) if "EngineCore" in " ".join(p.cmdline())]
    assert cores, f"no EngineCore among the children of rollout/1 (pid {worker})"
    t0 = time.time()
    os.kill(cores[0], signal.SIGSTOP)
    try:
        named = wait_until(lambda: [e for e in sup.events() if e["kind"] == "alert" and e["ts"] >= t0
                                    and not e.get("cleared") and "rollout/1" in e.get("targets", [])], 60,
                           "an alert naming rollout/1")[0]
        # the worker's stack, and after it its engine's, said stopped
        with sup.client(timeout_s=5) as c:
            c.request("dump_stacks", {"targets": ["rollout/1"], "dump_id": "engine"})
        stack = wait_until(lambda: [e for e in sup.events() if e["kind"] == "stack" and e["dump_id"] == "engine"],
                           15, "rollout/1's stack")[0]
    finally:
        os.kill(cores[0], signal.SIGCONT)
    own, _, engine = stack["text"].partition(f"Child process {cores[0]} (VLLM::EngineCore")
    assert "RolloutWorker." in own, stack
    assert f"process {cores[0]} is stopped" in engine and "run_busy_loop (" in engine, engine[:2000]
    assert named["ts"] - t0 < 15, named
    assert named["code"] in ("straggler", "slower_than_usual", "heartbeat_stale", "sync_part_slow"), named
    # whichever engine call comes next waits on the frozen core: a generate, or a sync's push into the engine
    # (the load, the cache's reset or the fingerprint read back: that part named, as the sync's parts are)
    pushing = named["code"] == "sync_part_slow" and named["evidence"]["part"] in ("load", "reset_cache", "verify")
    assert pushing or "generate" in named["message"] or "sync_weights" in named["message"], named["message"]
    with sup.client(timeout_s=5) as c:
        c.request("stop")
