"""Any command as a run's driver (`gkd-tui launch -- COMMAND`): a plain Ray job, unmodified, reports
through Ray's own hooks (gkd_core/integrations) and is diagnosed like our trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import attach_plain, gkd_tui, logged_events, opted_in, read_until, status_json, wait_until

from gkd_core import rundir
from gkd_core.integrations import job_env, ray_hook

ROOT = Path(__file__).resolve().parents[2]
JOBS = ROOT / "tests" / "jobs"


def launch(command: list[str]) -> Path:
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", *command)
    assert got.returncode == 0, got.stderr
    return rundir.resolve_run(None)


def state_of(run: Path) -> dict | None:
    got = status_json(run)
    return got["state"] if got else None


def holding(run: Path, code: str) -> list[dict]:
    """The alerts of ``code`` that hold now, as `gkd-tui status` says ([] before it answers)."""
    st = state_of(run) or {"alerts": {}}
    return [a for a in st["alerts"].values() if a["code"] == code and not a.get("cleared")]


def events(run: Path) -> list[dict]:
    return logged_events(run)


def wait_ended(run: Path, timeout_s: float) -> str:
    def ended():
        ev = logged_events(run)
        states = [e["state"] for e in ev if e.get("kind") == "run"]
        return states[-1] if states and states[-1] in ("finished", "failed", "stopped") else None
    return wait_until(ended, timeout_s, "the run's end", every_s=0.5)


# --- the environment, and nothing when not asked -------------------------------------------------

def test_the_command_gets_the_run_and_keeps_a_runtime_env_hook_of_its_own():
    env = job_env.command_env({"RAY_RUNTIME_ENV_HOOK": "theirs.mod.hook", "PATH": "/bin"}, run_id="r1",
                              run_dir="RUN", ingest="ipc://RUN/ingest.sock", heartbeat=0.5)
    assert env[job_env.RAY_HOOK] == job_env.OUR_RAY_HOOK
    assert env[job_env.USER_RAY_HOOK] == "theirs.mod.hook"
    assert job_env.asked(env) and env[job_env.HEARTBEAT_S] == "0.5" and env["PATH"] == "/bin"
    assert job_env.run_vars(env) == {"GKD_REPORT": "1", "GKD_RUN_ID": "r1", "GKD_RUN_DIR": "RUN",
                                     "GKD_INGEST": "ipc://RUN/ingest.sock", "GKD_HEARTBEAT_S": "0.5",
                                     "TORCH_FR_BUFFER_SIZE": "2000"}
    # the Flight Recorder: on unless the job said otherwise
    off = job_env.command_env({"TORCH_FR_BUFFER_SIZE": "0"}, run_id="r1", run_dir="RUN", ingest="ipc://x", heartbeat=1)
    assert off["TORCH_FR_BUFFER_SIZE"] == "0" and job_env.run_vars(off)["TORCH_FR_BUFFER_SIZE"] == "0"
    # collectives not tracked (GKD_COLLECTIVES=0): the recorder is off too, and every worker is told
    untracked = job_env.command_env({"GKD_COLLECTIVES": "0"}, run_id="r1", run_dir="RUN", ingest="ipc://x",
                                    heartbeat=1)
    assert untracked["TORCH_FR_BUFFER_SIZE"] == "0"
    assert job_env.run_vars(untracked)["GKD_COLLECTIVES"] == "0"
    again = job_env.command_env({**env, job_env.DRIVER_PID: "4242"}, run_id="r2", run_dir="RUN",
                                ingest="ipc://x", heartbeat=1)
    assert job_env.DRIVER_PID not in again  # a run started from inside a watched job has its own driver
    assert again[job_env.USER_RAY_HOOK] == "theirs.mod.hook"  # ours is never chained to itself


def test_not_asked_the_hooks_change_nothing_and_start_nothing(monkeypatch):
    for k in job_env.RUN_VARS:
        monkeypatch.delenv(k, raising=False)
    threads = set(threading.enumerate())
    before = {"env_vars": {"A": "1"}, "pip": ["x"]}
    assert ray_hook.runtime_env_hook(before) is before
    ray_hook.setup_worker()
    assert ray_hook._process is None
    assert set(threading.enumerate()) == threads


def test_a_users_own_hooks_run_first_and_ours_is_added(monkeypatch, tmp_path):
    (tmp_path / "their_hooks.py").write_text(
        "calls = []\n"
        "def env_hook(rt):\n"
        "    calls.append('env'); return {**(rt or {}), 'env_vars': {'THEIRS': '1'}}\n"
        "def setup():\n    calls.append('setup')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(job_env.USER_RAY_HOOK, "their_hooks.env_hook")
    monkeypatch.setenv(job_env.REPORT, "1")
    monkeypatch.setenv(job_env.RUN_ID, "r1")
    monkeypatch.setenv(job_env.INGEST, "ipc://nowhere")
    monkeypatch.setenv(job_env.DRIVER_PID, "")  # the hook marks this process as the driver: undone after
    installed = []
    monkeypatch.setattr(ray_hook, "_install", installed.append)  # the patches themselves: the e2e tests' part
    out = ray_hook.runtime_env_hook({"worker_process_setup_hook": "their_hooks.setup"})
    import their_hooks

    assert their_hooks.calls == ["env"] and installed == ["driver"]
    assert out["env_vars"]["THEIRS"] == "1" and out["env_vars"]["GKD_RUN_ID"] == "r1"
    assert out["env_vars"][job_env.DRIVER_PID] == str(os.getpid())
    # their setup hook is kept, to be run by ours first, in every worker
    assert out["worker_process_setup_hook"] == job_env.WORKER_SETUP_HOOK
    assert out["env_vars"][ray_hook.USER_SETUP_HOOK] == "their_hooks.setup"
    monkeypatch.setenv(ray_hook.USER_SETUP_HOOK, "their_hooks.setup")
    ray_hook.setup_worker()
    assert their_hooks.calls == ["env", "setup"] and installed == ["driver", "worker"]


def test_a_child_of_the_driver_that_imports_a_plugin_is_not_a_second_driver(tmp_path):
    """A DataLoader's worker or vLLM's child inherits the run's variables and imports verl: it must not
    report as ``driver`` (its hello would take the driver's command channel); the driver itself does."""
    probe = ("import os, sys\n"
             "from gkd_core.integrations import ray_hook, job_env\n"
             "p = ray_hook.ensure_installed()\n"
             "print(p.kind if p else None, os.environ.get(job_env.DRIVER_PID) == str(os.getpid()))\n")
    env = {**os.environ, job_env.REPORT: "1", job_env.RUN_ID: "r1", job_env.INGEST: f"ipc://{tmp_path}/in.sock",
           job_env.RUN_DIR: str(tmp_path)}
    env.pop(job_env.COMMANDS, None)
    env.pop(job_env.DRIVER_PID, None)
    first = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert first.stdout.split() == ["driver", "True"], first.stderr
    child = subprocess.run([sys.executable, "-c", probe], env={**env, job_env.DRIVER_PID: str(os.getpid())},
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.split() == ["None", "False"], child.stderr


def test_a_job_that_shuts_ray_down_and_starts_it_again_lives_through_it(tmp_path):
    """verl's own tests shut Ray down and start it again in one process: a wait the watcher showed in the first
    session must not hold its object refs into the next, where freeing one ends the process ("the core worker
    has already been shutdown") with nothing on stderr but Ray's line."""
    env = {**os.environ, job_env.REPORT: "1", job_env.RUN_ID: "r1", job_env.INGEST: f"ipc://{tmp_path}/in.sock",
           "RAY_RUNTIME_ENV_HOOK": "gkd_core.integrations.ray_hook.runtime_env_hook"}
    for name in (job_env.COMMANDS, job_env.DRIVER_PID, job_env.RUN_DIR):
        env.pop(name, None)
    got = subprocess.run([sys.executable, str(JOBS / "ray_started_twice.py"), "2"], env=env, capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert got.returncode == 0 and "all rounds done" in got.stdout, (got.stdout[-2000:], got.stderr[-2000:])


def test_launch_with_nothing_after_the_separator_says_so(gkd_home):
    got = gkd_tui("launch", "--detach", "--")
    assert got.returncode == 2 and "nothing after `--`" in got.stderr


# --- real jobs ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_sixteen_actors_two_stuck_in_init_one_in_a_call_its_peers_finished(gkd_home):
    """The three named within seconds, by class, method and index, and the stuck line one dump away."""
    job = JOBS / "ray_sixteen_actors.py"
    stuck_line = next(i for i, line in enumerate(job.read_text().splitlines(), 1) if "the line its stack" in line)
    run = launch([sys.executable, str(job)])
    try:
        def named():
            st = state_of(run)
            if st is None:
                return None
            late = {t: a for a in st["alerts"].values() if a["code"] == "straggler" and not a.get("cleared")
                    for t in a["targets"]}
            return st if set(late) == {"Learner/3", "Learner/9", "Learner/11"} else None

        st = wait_until(named, 120, "Learner/3, Learner/11 (in __init__) and Learner/9 (in train) named",
                        every_s=0.5)
        ws = st["workers"]
        assert len([w for w in ws if w.startswith("Learner/")]) == 16
        assert ws["Learner/3"]["phase"] == ws["Learner/11"]["phase"] == "__init__"
        assert ws["Learner/9"]["phase"] == "train" and ws["Learner/9"]["phase_call"] == 3
        assert ws["Learner/9"]["rank"] == 9 and ws["Learner/9"]["role"] == "Learner"
        assert ws["driver"]["phase"] == "ray.get"
        assert not [a for a in st["alerts"].values() if a["code"] == "straggler" and not a.get("cleared")
                    and not set(a["targets"]) <= {"Learner/3", "Learner/9", "Learner/11"}]

        got = gkd_tui("dump-stacks", "--run", str(run), "--json", "Learner/9", timeout=30)
        dump = json.loads(got.stdout)
        assert got.returncode == 0, (got.stderr, dump.get("missing"))
        [group] = dump["groups"]
        assert group["targets"] == ["Learner/9"]
        assert f"ray_sixteen_actors.py:{stuck_line}" in group["stack"]
        assert "Learner.train" in group["where"] and "integrations" not in group["where"]

        # c on it: its pending call cancelled by the job's driver; with force, killed, and the job fails
        def cancelled(mode: str):
            acts = [e for e in events(run) if e.get("kind") == "action" and e["op"] == "cancel"
                    and isinstance(e.get("result"), dict) and e["result"].get("mode") == mode]
            return acts[-1] if acts else None

        got = gkd_tui("cancel", "Learner/9", "--run", str(run))
        assert got.returncode == 0, got.stderr
        act = wait_until(lambda: cancelled("cooperative"), 15, "the driver's cancel", every_s=0.2)
        assert act["ok"] and act["result"]["outcome"]["Learner/9"].startswith("1 pending call(s) cancelled (train)")
        got = gkd_tui("cancel", "Learner/9", "--force", "--run", str(run))
        assert got.returncode == 0, got.stderr
        act = wait_until(lambda: cancelled("force"), 15, "the driver's kill", every_s=0.2)
        assert act["ok"] and act["result"]["outcome"] == {"Learner/9": "killed"}
        assert wait_ended(run, 60) == "failed"  # its ray.get raised: the job's own choice, on the record
        assert "ActorDiedError" in (run / "logs" / "driver.log").read_text() or "TaskCancelledError" in (
            run / "logs" / "driver.log").read_text()
    finally:
        gkd_tui("stop", str(run))


@pytest.mark.slow
def test_a_command_that_exits_ends_the_run_with_its_code_and_its_output_kept(gkd_home, tmp_path):
    job = tmp_path / "job.py"
    job.write_text("import ray, sys\n"
                   "@ray.remote(num_cpus=0.5)\nclass A:\n    def f(self): return 1\n"
                   "ray.init(num_cpus=2, include_dashboard=False)\n"
                   "print('ANSWER', ray.get(A.remote().f.remote()), flush=True)\nsys.exit(7)\n")
    run = launch([sys.executable, str(job)])
    assert wait_ended(run, 120) == "failed"
    assert "ANSWER 1" in (run / "logs" / "driver.log").read_text()
    ev = logged_events(run)
    [end] = [e for e in ev if e.get("kind") == "run" and e["state"] == "failed"]
    assert end["exit_code"] == 7
    assert {e["src"] for e in ev if e.get("kind") == "worker"} == {"driver", "A/0"}


@pytest.mark.slow
def test_a_command_that_cannot_start_fails_the_run_with_a_reason(gkd_home):
    run = launch(["no-such-program-for-gkd"])
    assert wait_ended(run, 30) == "failed"
    ev = logged_events(run)
    [end] = [e for e in ev if e.get("kind") == "run" and e["state"] == "failed"]
    assert end["exit_code"] == 127 and "no-such-program-for-gkd" in end["reason"]


# --- a job that cannot start --------------------------------------------------------------------

def test_a_placement_group_no_node_can_host_is_said_with_the_numbers():
    from gkd_core.diagnosis import diagnose
    from gkd_core.state import RunState
    from gkd_core.telemetry import events as ev

    st = RunState()
    t0 = 1000.0
    for e in (ev.RunEvent(state="running", ts=t0),
              ev.RayNodeEvent(node="10.0.0.1", node_id="n1", state="ALIVE", resources={"CPU": 4.0}, ts=t0),
              ev.RayPlacementGroupEvent(pg_id="a" * 36, name="global_pool", state="PENDING", strategy="PACK",
                                        bundles=[{"CPU": 10.0}] * 2, scheduling="INFEASIBLE", ts=t0),
              ev.RayPlacementGroupEvent(pg_id="b" * 36, name="busy_pool", state="PENDING", strategy="PACK",
                                        bundles=[{"CPU": 2.0}], scheduling="QUEUED", ts=t0),
              ev.RayPlacementGroupEvent(pg_id="c" * 36, name="packed", state="PENDING", strategy="STRICT_PACK",
                                        bundles=[{"CPU": 3.0}] * 2, ts=t0),
              ev.RayPlacementGroupEvent(pg_id="d" * 36, name="holder", state="CREATED", strategy="PACK",
                                        bundles=[{"CPU": 3.0}], ts=t0)):
        st.apply(e)
    early = {a.targets[0]: a for a in diagnose(st, t0 + 2) if a.code == "unschedulable"}
    assert set(early) == {"pg/global_pool", "pg/packed"}  # the queued one is not said before PG_PENDING_S
    assert early["pg/global_pool"].severity == "critical"
    assert "{CPU 10} × 2 (PACK)" in early["pg/global_pool"].message
    assert "no node has CPU 10 (the largest of 1 node has CPU 4)" in early["pg/global_pool"].message
    assert "STRICT_PACK puts them on one node, and no node has CPU 6" in early["pg/packed"].message
    later = {a.targets[0]: a for a in diagnose(st, t0 + 12) if a.code == "unschedulable"}
    assert later["pg/busy_pool"].severity == "warn" and "others hold it" in later["pg/busy_pool"].message
    st.apply(ev.RayPlacementGroupEvent(pg_id="b" * 36, state="REMOVED", ts=t0 + 13))
    assert "pg/busy_pool" not in {a.targets[0] for a in diagnose(st, t0 + 14) if a.code == "unschedulable"}


def _pool_alerts(alerts) -> dict[str, dict]:
    return {a["targets"][0]: a for a in alerts if a["code"] == "unschedulable" and not a.get("cleared")}


@pytest.mark.slow
def test_pools_that_never_start_under_launch(gkd_home):
    run = launch([sys.executable, str(JOBS / "ray_placement_groups.py")])
    try:
        def said():
            st = state_of(run)
            got = _pool_alerts(st["alerts"].values()) if st else {}
            return got if {"pg/global_pool", "pg/busy_pool"} <= set(got) else None

        got = wait_until(said, 60, "both pools said", every_s=0.5)
        assert got["pg/global_pool"]["severity"] == "critical"
        assert "no node has CPU 10 (the largest of 1 node has CPU 4)" in got["pg/global_pool"]["message"]
        assert got["pg/busy_pool"]["severity"] == "warn" and "others hold it" in got["pg/busy_pool"]["message"]
        assert "pg/holder" not in got
    finally:
        gkd_tui("stop", str(run))


@pytest.mark.slow
def test_pools_that_never_start_through_the_ray_state_api_alone():
    """`attach --ray-address auto --plain`: no run, no gkd in the job."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GKD_") and k != "RAY_RUNTIME_ENV_HOOK"}
    job = subprocess.Popen([sys.executable, str(JOBS / "ray_placement_groups.py"), "--dashboard"], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        read_until(job, "pools asked")
        t0 = time.monotonic()

        def said():
            out = attach_plain(env)
            return out if "can never be placed" in out and "others hold it" in out else None

        out = wait_until(said, 60, "attach --plain names both pools", every_s=2)
        assert time.monotonic() - t0 < 30 + 15, "said, but not within 30 s of the pools' request (+ one attach)"
        assert "placement group global_pool can never be placed: it asks for {CPU 10} × 2;" in out
        assert "placement group busy_pool pending" in out
    finally:
        os.killpg(job.pid, 9)
        job.wait(30)


@pytest.mark.slow
def test_a_job_started_by_its_user_that_opts_in_is_a_run_of_its_own(gkd_home, tmp_path):
    """`GKD_WATCH=1 python job.py` (with Ray's hook named, as README says): the job starts its run."""
    job = tmp_path / "job.py"
    job.write_text("import time, ray\n"
                   "@ray.remote(num_cpus=0.25)\nclass Learner:\n"
                   "    def train(self, step): time.sleep(0.5); return step\n"
                   "ray.init(num_cpus=2, include_dashboard=False)\n"
                   "ls = [Learner.remote() for _ in range(3)]\n"
                   "for step in range(12): ray.get([l.train.remote(step) for l in ls])\n"
                   "print('USER JOB DONE', flush=True)\n")
    proc, run = opted_in([sys.executable, str(job)], dict(os.environ), **{job_env.RAY_HOOK: job_env.OUR_RAY_HOOK})
    try:
        def training():
            st = state_of(run)
            ws = st["workers"] if st else {}
            return st if {f"Learner/{i}" for i in range(3)} <= set(ws) and ws["Learner/2"]["phase"] == "train" \
                else None

        st = wait_until(training, 60, "three Learners in train", every_s=0.2)
        assert f"watching pid {proc.pid}" in st["reason"]
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    assert proc.returncode == 0 and "USER JOB DONE" in out, err[-2000:]
    assert f"this job is watched as run {run.name}" in err
    assert wait_ended(run, 30) == "finished"
    supervisor = json.loads((run / "endpoints.json").read_text())["supervisor_pid"]
    gkd_tui("stop", str(run))  # its supervisor lingers for an attach after the end; not in a test
    wait_until(lambda: not Path(f"/proc/{supervisor}").exists(), 30, "its supervisor to exit", every_s=0.2)
    # taken over later (`gkd-tui restart` once the supervisor is gone): refused, not our trainer started
    got = subprocess.run([sys.executable, "-m", "gkd_core", "run", "--resume", str(run)], capture_output=True,
                         text=True, timeout=60)
    assert got.returncode == 2 and f"it watched a job its user started (pid {proc.pid})" in got.stderr, got.stderr
    assert [e["state"] for e in events(run) if e.get("kind") == "run"][-1] == "finished"  # and nothing started


def test_a_rank_of_a_plain_ray_jobs_gloo_group_that_never_joins_the_broadcast_is_named(gkd_home):
    """Four actors of a job we did not write in one gloo group; rank 2 never calls the broadcast of round 3.
    Read from PyTorch's Flight Recorder (on in a watched job): Ranker/2 and the collective's number."""
    job = JOBS / "ray_gloo_four.py"
    run = launch([sys.executable, str(job)])
    try:
        alert = wait_until(lambda: next(iter(holding(run, "collective_not_joined")), None), 180,
                           "Ranker/2 named as not in the broadcast", every_s=0.5)
        assert alert["targets"] == ["Ranker/2"], alert
        # rounds 1 and 2 were broadcasts #1 and #2 of the default group; round 3 is #3
        assert alert["message"].startswith("Ranker/2 has not joined broadcast #3 of group default_pg; 3 peer(s) "
                                           "waiting"), alert["message"]
        got = [e for e in events(run) if e.get("kind") == "collectives" and e["src"] == "Ranker/0"]
        assert got and got[-1]["groups"][0]["source"] == "flight_recorder" and "left" in got[-1]["groups"][0]
        assert got[-1]["groups"][0]["left"] is None  # gloo: the recorder never says a collective completed
    finally:
        gkd_tui("stop", str(run))
