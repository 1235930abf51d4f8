"""The bug report of a stuck plain Ray job under `gkd-tui launch --` (tests/jobs/ray_deadlock.py, deadlocked
after 2 s): `gkd-tui bundle` takes every worker's stacks for it and writes one archive holding each item a
maintainer asks for (seed 004's checklist, verl #7180's `ray list actors --detail` and `py-spy dump`). A token
planted in the job's environment (and printed by it into its log) and the one in Ray's auth file are in none
of its files."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import tarfile
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
from conftest import gkd_tui, logged_events, wait_until

from gkd_core import rundir

JOBS = Path(__file__).resolve().parents[1] / "jobs"
pytestmark = pytest.mark.slow


@pytest.mark.timeout(300)
def test_a_stuck_jobs_bundle_holds_every_item_and_never_a_token(gkd_home, tmp_path):
    ray_token = secrets.token_hex(24)  # the cluster's own token: the job's Ray uses it (token auth is on)
    token_file = tmp_path / "ray_auth_token"
    token_file.write_text(ray_token + "\n")
    planted = "hf_" + secrets.token_hex(14)
    shaping = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "CUDA_VISIBLE_DEVICES": "",
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "GKD_TEST_MARK": "bundle", "OMP_NUM_THREADS": "1"}
    env = dict(os.environ, HF_TOKEN=planted, RAY_AUTH_TOKEN_PATH=str(token_file), **shaping)
    # a wrapper as users write them: it prints the token (a log that leaks one) and a traceback, then runs
    # the job, which deadlocks after 2 s of healthy rounds
    script = (f'echo "the job sees HF_TOKEN=$HF_TOKEN"; {sys.executable} -c "import json; json.loads(\'{{\')"; '
              f'exec {sys.executable} {JOBS / "ray_deadlock.py"} 2')
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", "bash", "-c", script, env=env)
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def deadlocked():
            return [e for e in logged_events(run) if e["kind"] == "alert" and e["code"] == "deadlock"
                    and not e.get("cleared")]

        wait_until(deadlocked, 150, "a deadlock named", every_s=1.0)
        out = tmp_path / "report.tar.gz"
        t0 = time.monotonic()
        got = gkd_tui("bundle", str(run), "-o", str(out), env=env, timeout=120)
        took = time.monotonic() - t0
        assert got.returncode == 0, got.stderr
        assert oct(out.stat().st_mode & 0o777) == "0o600"
        files = unpack(out)
    finally:
        gkd_tui("stop", str(run))
    print(f"bundle written in {took:.1f} s: {len(files)} files")

    # nothing secret, anywhere: not the planted token (the job printed it into its log), not Ray's, not keys
    for name, data in files.items():
        assert planted.encode() not in data and ray_token.encode() not in data, name
    assert not any("/keys/" in n or "/checkpoints/" in n for n in files), sorted(files)
    log = files["logs/driver.log"].decode()
    assert "the job sees HF_TOKEN=<redacted>" in log, log[:500]

    summary = files["summary.md"].decode()
    assert summary.startswith("# ") and "deadlock" in summary.splitlines()[0], summary[:300]
    for section in ("## What the dashboard says", "## What was tried", "## Command", "## Environment",
                    "## Ray's view", "## Tracebacks", "## Files in this bundle"):
        assert section in summary, section
    # the members of the cycle, each at its line, in the table the summary leads with
    assert re.search(r"\| Trainer/0 \|.*ray_deadlock\.py:\d+", summary), summary

    # hardware and versions, read with the driver's python
    facts = json.loads(files["environment.json"])
    hw, versions = facts["hardware"], facts["versions"]
    assert hw["cpus"] >= 1 and hw["memory_total"] > 0 and hw["memory_limit"]["limit"] > 0
    assert hw["gpus"]["devices"] or hw["gpus"]["none"]  # each GPU, or why there is none
    for name in ("python", "torch", "ray", "vllm", "verl", "transformers", "gkd-tui"):
        assert versions[name], name  # vllm and verl live in venvs of their own: "not installed" here
    for name in ("torch", "ray", "transformers", "gkd-tui"):  # the driver's, read with its python
        assert versions[name] == metadata.version(name), (name, versions[name])
    assert versions["python"] == sys.version.split()[0]
    cuda = versions["torch_build"]["cuda"]  # torch's CUDA and NCCL, or that it is a CPU build
    assert cuda == torch.version.cuda
    assert versions["torch_build"]["nccl"] == ("none: a CPU build of torch" if cuda is None else
                                               ".".join(map(str, torch.cuda.nccl.version())))
    # the command and the variables in effect, the token's value hidden
    driver = facts["driver"]
    assert driver["argv"][:2] == ["bash", "-c"] and "ray_deadlock.py" in driver["argv"][2] and driver["pid"] > 0
    for name, value in shaping.items():  # each family that shapes a run: NCCL_, TORCH_, CUDA_, VLLM_, GKD_...
        assert driver["env"][name] == value, name
    assert driver["env"]["HF_TOKEN"] == "<redacted>" and "RAY_AUTH_TOKEN_PATH" in driver["env"]
    assert "ray_deadlock.py" in summary.split("## Command")[1].split("##")[0]

    # stacks of every worker, taken for the bundle: the grouped report, and each in the dump's folder
    stacks = files["stacks.txt"].decode()
    for member in ("Trainer/0", "Inference/0", "Learner/0", "Rollout/0"):
        assert member in stacks, (member, stacks[:1000])
    assert "ray_deadlock.py:" in stacks
    folders = {n.split("/")[1] for n in files if n.startswith("stacks/bundle-")}
    assert len(folders) == 1 and sum(n.startswith(f"stacks/{next(iter(folders))}/") for n in files) >= 5

    # Ray's view: the state API's, asked when the bundle was written, and the run's
    ray = json.loads(files["ray.json"])
    live = ray["live"]
    assert "error" not in live, live
    assert live["nodes"] and all(n["state"] == "ALIVE" and n["resources"].get("CPU") for n in live["nodes"])
    classes = {a["class"] for a in live["actors"] if a["state"] == "ALIVE"}
    assert {"Trainer", "Inference", "Learner", "Rollout"} <= classes, live["actors"]
    assert all(a["node_id"] for a in live["actors"] if a["state"] == "ALIVE")
    assert {a["worker"] for a in ray["run"]["actors"]} >= {"Trainer/0", "Inference/0"}
    # the job's placement group with its demand, and the summary's count of it
    groups = {g["name"]: g for g in live["placement_groups"]}
    assert groups["rollout-group"]["state"] == "CREATED", live["placement_groups"]
    assert groups["rollout-group"]["bundles"] == [{"CPU": 1.0}], groups["rollout-group"]
    assert "1 placement group(s)" in summary.split("## Ray's view")[1], summary

    # what the dashboard said and what was tried; the run's own files; the traceback in the log
    said = json.loads(files["alerts_and_actions.json"])
    assert any(a["code"] == "deadlock" for a in said["alerts"])
    assert any(a.get("op") == "dump_stacks" for a in said["actions"])
    for name in ("config.yaml", "events.jsonl", "status.txt", "driver.json"):
        assert name in files, name
    traces = files["tracebacks.txt"].decode()
    assert "Traceback (most recent call last):" in traces and "JSONDecodeError" in traces, traces[:500]
    assert "JSONDecodeError" in summary.split("## Tracebacks")[1]


@pytest.mark.timeout(300)
def test_every_actor_alive_in_rays_view_has_its_stacks_in_the_bundle_reported_or_not(gkd_home, tmp_path):
    """Issue #54 (11): a bundle taken while a job starts listed 8 actors ALIVE in Ray's view, its summary knew 4,
    and only the workers the dump had named were taken. Here 4 of the job's 8 actors have not reported to the run
    when the bundle is written (tests/jobs/ray_unreported_actors.py): each of the 8 pids Ray's view has, alive,
    has its own stack in the bundle, and the summary lists the 4 by class and pid."""
    job = JOBS / "ray_unreported_actors.py"
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(job))
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        def alive() -> list[int]:
            log = run / "logs" / "driver.log"
            lines = [ln for ln in log.read_text().splitlines() if ln.startswith("ALIVE ")] if log.exists() else []
            return [int(p) for p in lines[0].split()[1:]] if lines else []

        pids = wait_until(alive, 150, "the job's 8 actors alive", every_s=0.5)
        # the 4 that report are in their `wait` (the others were asked at the same moment): the stacks to find
        wait_until(lambda: {e["src"] for e in logged_events(run) if e["kind"] == "phase" and e.get("phase") == "wait"}
                   >= {f"Sleeper/{i}" for i in range(4)}, 60, "Sleeper/0..3 in wait", every_s=0.5)
        out = tmp_path / "report.tar.gz"
        got = gkd_tui("bundle", str(run), "-o", str(out), timeout=120)
        assert got.returncode == 0, got.stderr
        files = unpack(out)
    finally:
        gkd_tui("stop", str(run))

    ray = json.loads(files["ray.json"])
    assert "error" not in ray["live"], ray["live"]
    in_rays_view = sorted(a["pid"] for a in ray["live"]["actors"] if a["state"] == "ALIVE" and a["class"] == "Sleeper")
    assert in_rays_view == sorted(pids), (in_rays_view, pids)
    # the case of the issue: the run's state knows only some of the actors Ray has alive
    unknown = set(pids) - {a["pid"] for a in ray["run"]["actors"]}
    assert len(unknown) == 4, ray["run"]["actors"]

    folders = {n.split("/")[1] for n in files if n.startswith("stacks/bundle-")}
    assert len(folders) == 1, folders
    saved = [data.decode() for n, data in files.items() if n.startswith(f"stacks/{next(iter(folders))}/")]
    summary = files["summary.md"].decode()
    for pid in pids:
        own = [text for text in saved if f"Process {pid}:" in text]  # py-spy's first line: the process it read
        assert own and "ray_unreported_actors.py:" in own[0], (pid, [t[:200] for t in saved],
                                                               summary.split("## What was tried")[0])
    for pid in unknown:  # listed in the summary, by class and pid, with where its stack stands
        row = next((ln for ln in summary.splitlines() if ln.startswith(f"| Sleeper pid {pid} |")), None)
        assert row is not None and "(not reported to the run)" in row and "not taken" not in row, summary
    assert "not taken" not in summary.split("## What was tried")[0], summary


def unpack(archive: Path) -> dict[str, bytes]:
    """Every file of the archive, by its path under the archive's one top folder."""
    out = {}
    with tarfile.open(archive) as tar:
        tops = {m.name.split("/")[0] for m in tar.getmembers()}
        assert len(tops) == 1, tops
        for m in tar.getmembers():
            if m.isfile():
                out[m.name.split("/", 1)[1]] = tar.extractfile(m).read()
    return out
