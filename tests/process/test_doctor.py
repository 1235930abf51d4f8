"""`gkd-tui doctor`: a preflight that finishes quickly and never crashes on a machine without GPUs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from conftest import nvml_library_loads


def doctor(*args: str, env: dict | None = None) -> tuple[int, str, float]:
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "doctor", *args], capture_output=True, text=True,
                       timeout=60, env=env)
    return p.returncode, p.stdout + p.stderr, time.monotonic() - t0


def test_on_this_cpu_machine_it_warns_no_gpu_within_ten_seconds(tmp_path):
    env = dict(os.environ, GKD_HOME=str(tmp_path))
    code, out, took = doctor(env=env)
    assert took < 10.0, out
    assert code == 0, out
    lines = [line for line in out.splitlines() if " gpus " in line]
    if nvml_library_loads():  # a GPU machine: its GPUs counted
        assert len(lines) == 1 and lines[0].startswith(("PASS", "WARN")) and "GPU(s) through NVML" in lines[0], out
    else:  # no driver: a warning that says so, not a failure
        assert lines == ["WARN  gpus         no GPU: no NVIDIA driver on this node "
                         "(NVML Shared Library Not Found)"], out
    assert "Traceback" not in out and "passed" in out


def test_a_bad_config_and_a_trap_in_the_environment_are_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  total_stepz: 3\n")
    env = dict(os.environ, GKD_HOME=str(tmp_path), TORCH_NCCL_ASYNC_ERROR_HANDLING="0")
    code, out, _ = doctor(str(bad), "--json", env=env)
    checks = {c["name"]: c for c in json.loads(out[out.index("["):])}
    assert code == 1
    assert checks["config"]["status"] == "fail" and "total_steps" in checks["config"]["detail"]
    trap = checks["env TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    assert trap["status"] == "warn" and "hangs instead of raising" in trap["detail"]


def test_inconsistent_batches_and_a_hung_nvml_fail_with_a_fix(tmp_path):
    env = dict(os.environ, GKD_HOME=str(tmp_path))
    code, out, took = doctor("data.batch_size=1", "rollout.n_workers=2", "--gpu-backend", "fake:hang_at=1", "--json",
                             env=env)
    checks = json.loads(out[out.index("["):])
    by = {c["name"]: c for c in checks}
    assert code == 1 and took < 10.0
    assert by["gpus"]["status"] == "fail" and "did not answer" in by["gpus"]["detail"] and by["gpus"]["fix"]
    batches = [c for c in checks if c["name"] == "batches"]
    assert any(c["status"] == "fail" and "rollout.n_workers" in c["detail"] and c["fix"] for c in batches)


def test_the_disk_check_weighs_free_space_against_the_checkpoints_kept(tmp_path, monkeypatch):
    from gkd_core import doctor as doc
    from gkd_core.config import load_config

    cfg = load_config(None)
    one = doc.checkpoint_estimate(cfg)
    assert 0.5e6 < one < 3e6  # the built-in student's checkpoint is about 1.2 MB on disk
    monkeypatch.setenv("GKD_HOME", str(tmp_path))
    check = doc.check_home(cfg)
    assert check.status == "pass" and "3 kept + 1 being written" in check.detail
    huge = load_config(None, ["model.n_embd=65536", "model.n_layer=64"])  # about 32 TB a checkpoint
    assert doc.check_home(huge).status == "fail" and "keep_checkpoints" in doc.check_home(huge).fix


def test_it_names_the_address_other_nodes_will_push_events_to(tmp_path):
    env = dict(os.environ, GKD_HOME=str(tmp_path))
    env.pop("RAY_ADDRESS", None)
    code, out, _ = doctor("--json", env=env)
    check = {c["name"]: c for c in json.loads(out[out.index("["):])}["other nodes"]
    # this node's Ray address and CurveZMQ (a warning instead on a machine with no network but loopback)
    assert (check["status"] == "pass" and "tcp://" in check["detail"] and "CurveZMQ" in check["detail"]
            and "127.0.0.1" not in check["detail"]) or check["status"] == "warn", check
    # an address of no interface here is refused, with this node's addresses as the fix
    code, out, _ = doctor("telemetry.bind_host=10.255.254.253", "--json", env=env)
    check = {c["name"]: c for c in json.loads(out[out.index("["):])}["other nodes"]
    assert code == 1 and check["status"] == "fail" and "not an address of this node" in check["detail"]
    assert "telemetry.bind_host=" in check["fix"]
    # on a worker node: the head it joins must answer (127.0.0.2 is no address of an interface here,
    # so it stands for another node; a closed port on it refuses at once)
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        closed = s.getsockname()[1]
    env["RAY_ADDRESS"] = f"127.0.0.2:{closed}"
    code, out, _ = doctor("--json", env=env)
    check = {c["name"]: c for c in json.loads(out[out.index("["):])}["other nodes"]
    assert check["status"] == "fail" and "127.0.0.2" in check["detail"] and "firewall" in check["fix"]
