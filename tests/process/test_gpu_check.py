"""bench/gpu_check.py, the check for the first GPU, as CI runs it: here it says there is no GPU and
passes; its rehearsal on the test backend runs the parts a machine without a GPU can run."""

from __future__ import annotations

import html
import subprocess
import sys

from conftest import ROOT, nvml_library_loads

SCRIPT = ROOT / "bench" / "gpu_check.py"


def run_check(*args: str, timeout_s: float) -> subprocess.CompletedProcess:
    # -X importtime lists every module it imported, on stderr
    return subprocess.run([sys.executable, "-X", "importtime", str(SCRIPT), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s)


def imported(stderr: str) -> set[str]:
    """The top-level packages in -X importtime's list (lines ``import time: self | cumulative | name``)."""
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_without_a_gpu_it_says_why_in_one_line_and_passes():
    done = run_check("--smoke", timeout_s=60)
    if nvml_library_loads():  # a GPU machine: every part ran, none failed
        assert done.returncode == 0 and " 0 failed" in done.stdout, done.stdout + done.stderr
        return
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [done.stdout.strip()]  # one line
    assert done.stdout.startswith("gpu_check: no GPU here: no NVIDIA driver on this node (NVML Shared Library Not "
                                  "Found); nothing to check"), done.stdout
    assert not imported(done.stderr) & {"ray", "zmq", "torch"}  # a GPU image has no Ray; torch only when needed


def test_a_rehearsal_on_the_test_backend_flags_a_frozen_nvidia_smi_and_shoots_the_pane(tmp_path):
    done = run_check("--backend", "fake:gpus=2", "--out", str(tmp_path), timeout_s=120)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "GPU1 GPU-fake-1 util" in out and "mem 21.0 GiB/80.0 GiB" in out
    verdicts = {line.split()[1]: line.split()[0] for line in out.splitlines() if line[:4] in ("PASS", "FAIL", "SKIP")}
    assert verdicts["nvml"] == "PASS" and verdicts["smi_hang"] == "PASS" and verdicts["screenshot"] == "PASS", out
    assert verdicts["proc_mem"] == "SKIP"  # the test backend lists no processes
    assert "an nvidia-smi stopped by SIGSTOP was flagged after" in out
    shown = html.unescape((tmp_path / "nvml_pane.svg").read_text()).replace("\xa0", " ")  # the SVG's spaces
    assert "GPU / NVML" in shown and "GPU1" in shown and "21G/80G" in shown
    assert not imported(done.stderr) & {"ray", "zmq"}
