"""`GKD_WATCH=1 torchrun --nproc_per_node 2 job.py` (verl's SFT trainer runs so): one run for the job, each rank
in it as a worker of its own (gkd_core/integrations/opt_in.py, torchrun.py). No Ray: gloo on CPU."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, gkd_tui, logged_events, wait_until

from gkd_core.integrations import opt_in

JOB = ROOT / "tests" / "jobs" / "torchrun_watched.py"
# the ranks import torch and Ray before their hook runs, on a node whose every core may be busy: no deadline of
# ours covers that, so this much beside the longest of ours (a rank's wait for the run its node's first rank starts)
IMPORTS_S = 120.0
pytestmark = pytest.mark.slow


class Job:
    """A torchrun job (one agent per simulated node) with GKD_WATCH=1, and what it left in GKD_HOME."""

    def __init__(self, home: Path, tmp: Path):
        self.home, self.go, self.pids = home, tmp / "go", tmp / "pids"
        self.pids.mkdir()
        self.agents: list[subprocess.Popen] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("GKD_", "TORCHELASTIC_"))}
        self.env.update(GKD_HOME=str(home), GKD_WATCH="1", JOB_GO_FILE=str(self.go), JOB_PIDS_DIR=str(self.pids),
                        GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
        self.env.pop("RAY_ADDRESS", None)

    def start(self, *torchrun_args: str, **env: str) -> subprocess.Popen:
        agent = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *torchrun_args, str(JOB)],
                                 env={**self.env, **env}, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        self.agents.append(agent)
        return agent

    def runs(self) -> list[Path]:
        root = self.home / "runs"
        return sorted(p for p in root.iterdir() if p.name != "latest") if root.is_dir() else []

    def in_group(self, ranks: range, round_: int = 0) -> dict[int, int] | None:
        """{rank: pid} once every rank of ``ranks`` joined the job's process group in torchrun's round ``round_``."""
        files = [self.pids / f"rank{r}.round{round_}" for r in ranks]
        if not all(f.exists() for f in files):
            return None
        return {r: int(f.read_text()) for r, f in zip(ranks, files, strict=True)}

    def finish(self) -> list[tuple[str, str]]:
        """The ranks told to end; every agent's (stdout, stderr) once it exited 0."""
        self.go.touch()
        outs = [a.communicate(timeout=IMPORTS_S) for a in self.agents]
        for a, (_, err) in zip(self.agents, outs, strict=True):
            assert a.returncode == 0, err[-3000:]
        return outs

    def close(self) -> None:
        """Nothing left behind: the agents killed if alive, every run's supervisor stopped (each lingers for an
        attach after its job)."""
        for a in self.agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait(30)
        for run in self.runs():
            supervisor = json.loads((run / "endpoints.json").read_text())["supervisor_pid"]
            gkd_tui("stop", str(run), home=self.home)
            wait_until(lambda pid=supervisor: not Path(f"/proc/{pid}").exists(), 30, "its supervisor to exit",
                       every_s=0.2)


@pytest.fixture
def job(gkd_home, tmp_path):
    j = Job(gkd_home, tmp_path)
    yield j
    j.close()


def ranks_in(run: Path) -> dict[str, dict]:
    """src -> the latest registration of each rank that reported to ``run`` and whose heartbeat came."""
    events = logged_events(run)
    beats = {e["src"] for e in events if e.get("kind") == "heartbeat"}
    return {e["src"]: e for e in events if e.get("kind") == "worker" and e["src"] in beats}


def reported(run: Path, pids: dict[int, int]) -> bool:
    """Every rank of ``pids`` registered with ``run`` from that process, as ``rank/<RANK>``, and beat."""
    got = ranks_in(run)
    return all(got.get(f"rank/{r}", {}).get("pid") == pid for r, pid in pids.items())


def run_state(run: Path) -> str:
    return ([e["state"] for e in logged_events(run) if e.get("kind") == "run"] or [""])[-1]


def test_the_ranks_of_a_torchrun_job_that_opts_in_report_to_one_run(job):
    agent = job.start("--standalone", "--nproc_per_node", "2")

    def one_run_with_both_ranks():
        runs = job.runs()
        assert len(runs) <= 1, f"one run per job, not one per rank: {[p.name for p in runs]}"
        pids = job.in_group(range(2))
        return runs[0] if runs and pids and reported(runs[0], pids) else None

    run = wait_until(one_run_with_both_ranks, opt_in.JOIN_WAIT_S + IMPORTS_S, "both ranks' events in one run",
                     every_s=0.2)
    [(_, err)] = job.finish()
    assert job.runs() == [run]
    assert {(w["role"], w["rank"]) for w in ranks_in(run).values()} == {("rank", 0), ("rank", 1)}
    # the run watches the job (torchrun's agent), not one of its ranks: the job's end is the run's end
    running = [e for e in logged_events(run) if e.get("kind") == "run" and e.get("state") == "running"]
    assert f"watching pid {agent.pid}, started by its user" in running[0]["reason"], running
    assert f"this torchrun job is watched as run {run.name}" in err, err[-3000:]
    assert "rank 1 of 2 (node 0 of 1) of torchrun job" in err and f"reports to run {run.name}" in err, err[-3000:]
    assert "one per node" not in err  # one node: nothing to say of other nodes
    assert wait_until(lambda: run_state(run) in ("finished", "failed") and run_state(run), 30,
                      "the run's end once the job ended", every_s=0.2) == "finished"


@pytest.mark.timeout(600)  # two rounds of imports
def test_the_ranks_torchrun_starts_again_join_the_run_their_job_has(job):
    job.start("--standalone", "--nproc_per_node", "2", "--max-restarts", "1", JOB_EXIT_IN_FIRST_ROUND="1")

    def second_round_in_one_run():
        runs = job.runs()
        assert len(runs) <= 1, f"one run per job, not one per round: {[p.name for p in runs]}"
        pids = job.in_group(range(2), round_=1)
        return runs[0] if runs and pids and reported(runs[0], pids) else None

    run = wait_until(second_round_in_one_run, opt_in.JOIN_WAIT_S + 2 * IMPORTS_S, "the second round's ranks in the "
                     "run of the first", every_s=0.2)
    [(out, err)] = job.finish()
    assert "RANK 1 EXITS IN THE FIRST ROUND" in out
    assert job.runs() == [run]
    assert err.count(f"this torchrun job is watched as run {run.name}") == 2, err[-3000:]  # rank 0, each round


def test_a_torchrun_job_over_two_nodes_is_one_run_per_node_and_says_so(job):
    with socket.socket() as s:  # the job's store, on the first node's agent
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    nodes = [job.start("--nnodes", "2", "--node-rank", str(n), "--nproc_per_node", "2", "--master-addr", "127.0.0.1",
                       "--master-port", port) for n in range(2)]

    def a_run_per_node():
        pids = job.in_group(range(4))
        if not pids:
            return None
        by_node = {}
        for run in job.runs():
            by_node[run] = sorted(ranks_in(run))
        return by_node if sorted(by_node.values()) == [["rank/0", "rank/1"], ["rank/2", "rank/3"]] and all(
            reported(run, {r: pids[r] for r in range(4) if f"rank/{r}" in srcs}) for run, srcs in by_node.items()) \
            else None

    by_node = wait_until(a_run_per_node, opt_in.JOIN_WAIT_S + IMPORTS_S, "a run per node, each with its ranks",
                         every_s=0.2)
    (_, err0), (_, err1) = job.finish()
    first, second = sorted(by_node, key=lambda run: by_node[run])
    for run, agent in ((first, nodes[0]), (second, nodes[1])):
        running = [e for e in logged_events(run) if e.get("kind") == "run" and e.get("state") == "running"]
        assert f"watching pid {agent.pid}, started by its user" in running[0]["reason"], running
    assert f"this torchrun job is watched as run {first.name}" in err0, err0[-3000:]
    assert f"this torchrun job is watched as run {second.name}" in err1, err1[-3000:]
    assert "this job is 2 runs, one per node" in err0 and "one per node" in err1
    assert f"rank 0's is on its node (127.0.0.1:{port})" in err1, err1[-3000:]
