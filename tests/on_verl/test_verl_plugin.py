"""verl 0.9 under the dashboard with no edit to its code: the `verl.plugins` entry point and Ray's hooks
(gkd_core/integrations), on a verl-shaped GKD job made of verl's own pieces (tests/jobs/verl_gkd_job.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import attach_plain, gkd_tui, needs, opted_in, read_until, status_json, wait_until

from gkd_core import rundir

# These run where verl 0.9 is installed: CI makes a venv of its own for them (.ci/run), with
# GKD_REQUIRE_VERL=1, under which a missing verl fails instead of skipping.
needs("verl", "GKD_REQUIRE_VERL", ".venv-verl")

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "tests" / "jobs" / "verl_gkd_job.py"
pytestmark = pytest.mark.slow


def events(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]


@pytest.fixture
def job_env(gkd_home):
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", JOB_HANG_RANK="1", JOB_HANG_STEP="3", JOB_STEPS="6")
    env.pop("RAY_ADDRESS", None)
    return env


@contextlib.contextmanager
def launched(env: dict) -> Iterator[Path]:
    """The verl-shaped job under `gkd-tui launch --detach`, its run stopped at the end whatever happened."""
    got = gkd_tui("launch", "--detach", "--linger", "0", "--", sys.executable, str(JOB), env=env)
    assert got.returncode == 0, got.stderr
    run = rundir.resolve_run(None)
    try:
        yield run
    finally:
        gkd_tui("stop", str(run))


def test_verl_plugin_is_registered_and_does_nothing_when_not_asked():
    from importlib.metadata import entry_points

    [ep] = [e for e in entry_points(group="verl.plugins") if e.name == "gkd"]
    assert ep.value == "gkd_core.integrations.verl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GKD_")}
    probe = ("import threading, verl, sys\n"
             "from gkd_core.integrations import ray_hook\n"
             "assert 'gkd_core.integrations.verl' in sys.modules, 'the plugin was not loaded by verl'\n"
             "print(ray_hook.installed(), sorted(t.name for t in threading.enumerate()))\n")
    got = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "None ['MainThread']"
    assert "gkd" not in got.stderr


def test_a_verl_job_run_without_gkd_runs_as_before(job_env):
    env = {k: v for k, v in job_env.items() if not k.startswith("GKD_") and k != "JOB_HANG_RANK"}
    env["JOB_STEPS"] = "2"
    got = subprocess.run([sys.executable, str(JOB)], capture_output=True, text=True, env=env, timeout=240)
    assert got.returncode == 0, got.stderr[-3000:]
    assert "VERL JOB DONE" in got.stdout
    assert "gkd" not in got.stderr.lower()


def test_a_verl_job_under_launch_step_phases_ranks_sync_and_the_rank_stuck_in_sync(job_env):
    stuck_line = next(i for i, line in enumerate(JOB.read_text().splitlines(), 1) if "the line its stack" in line)
    with launched(job_env) as run:
        # step 3's sync: rank 0 returned, rank 1 never will (and its own watcher, which ticks every 100 ms,
        # has shown it in the sync: the driver's wait may be shown a tick before)
        def in_sync():
            snap = status_json(run)
            view = snap and snap["sync_view"]
            rank1 = snap and snap["state"]["workers"].get("ActorRolloutWorker/1")
            return snap if (view and view["running"] and view["pending"] == ["ActorRolloutWorker/1"]
                            and rank1 and rank1["phase"] == "sync_rollout_weights") else None

        snap = wait_until(in_sync, 180, "the driver's wait on sync_rollout_weights, rank 1 pending", every_s=0.25)
        st = snap["state"]
        assert snap["sync_view"]["timeout_s"] == 600.0
        assert st["step"] == 3
        driver = st["workers"]["driver"]
        assert driver["phase"] == "update_weights" and driver["phase_step"] == 3, driver  # verl's timer
        assert "waiting for ActorRolloutWorker/1.sync_rollout_weights" in driver["detail"], driver
        ranks = {w["rank"]: w for s, w in st["workers"].items() if w["role"] == "ActorRolloutWorker"}
        assert sorted(ranks) == [0, 1]
        assert ranks[1]["phase"] == "sync_rollout_weights" and ranks[1]["phase_call"] == 3
        # verl's timers as the driver's phases, by step; its metrics per step
        # (a sync of a few ms is never shown: calls under 20 ms send nothing; the `step` timer is shown only
        # in the moments between the timers inside it, which a tick may or may not meet: its count is the step)
        wanted = {("gen", 1), ("update_actor", 1), ("gen", 2), ("update_weights", 3)}

        def timers() -> set | None:  # the log is flushed every 100 ms: the live state can be ahead of the file
            got = {(e["phase"], e.get("step")) for e in events(run)
                   if e.get("kind") == "phase" and e["src"] == "driver"}
            return got if wanted <= got else None

        assert wait_until(timers, 5, f"verl's timers {sorted(wanted)} in the log", every_s=0.2)
        ev = events(run)
        metrics = [e for e in ev if e.get("kind") == "metrics"]
        assert [m["step"] for m in metrics][:2] == [1, 2]
        assert metrics[1]["loss"] == pytest.approx(0.5) and "gen" in metrics[1]["timing"]
        started = min(e["ts"] for e in ev if e.get("kind") == "sync" and e["state"] == "started"
                      and e["pending"] == ["ActorRolloutWorker/1"])

        def named():
            snap = status_json(run)
            alerts = snap["state"]["alerts"].values() if snap else []
            return [a for a in alerts if a["code"] == "straggler" and a["targets"] == ["ActorRolloutWorker/1"]
                    and not a.get("cleared")]

        [alert] = wait_until(named, 30, "rank 1 named by its peer", every_s=0.25)
        assert alert["since"] - started < 10, alert
        assert "sync_rollout_weights" in alert["message"]

        got = gkd_tui("dump-stacks", "--run", str(run), "--json", "ActorRolloutWorker/1", timeout=30)
        dump = json.loads(got.stdout)
        assert got.returncode == 0, (dump.get("missing"), [e for e in events(run) if e.get("op") == "dump_stacks"
                                                           or e.get("kind") == "stack"][-6:])
        assert f"verl_gkd_job.py:{stuck_line}" in dump["groups"][0]["stack"]


def test_a_fused_verl_job_shows_each_actors_roles_and_their_methods(job_env):
    """verl's colocated roles (``create_colocated_worker_cls``): one ``WorkerDict`` actor a rank holding the
    actor-rollout and the reference worker; each is shown with its roles, its phases the fused methods."""
    env = {k: v for k, v in job_env.items() if k != "JOB_HANG_RANK"}
    env.update(JOB_FUSED="1", JOB_STEPS="3")
    with launched(env) as run:
        def roles():
            snap = status_json(run)
            ws = snap["state"]["workers"] if snap else {}
            fused = {s: w["role"] for s, w in ws.items() if s.startswith("WorkerDict/")}
            return fused if len(fused) == 2 and set(fused.values()) == {"actor_rollout+ref"} else None

        assert wait_until(roles, 180, "both fused actors shown with their roles", every_s=0.5) == {
            "WorkerDict/0": "actor_rollout+ref", "WorkerDict/1": "actor_rollout+ref"}
        wait_until(lambda: "VERL JOB DONE" in (run / "logs" / "driver.log").read_text(), 180, "the job to finish",
                   every_s=0.5)
        phases = {e["phase"] for e in events(run) if e.get("kind") == "phase" and e["src"] == "WorkerDict/0"}
        assert {"actor_rollout_generate_sequences", "ref_compute_ref_log_prob", "actor_rollout_update_actor"} <= \
            phases, phases


def test_verls_teacher_loop_counts_its_requests_and_a_server_that_stops_answering_leaves_them_owed(job_env):
    """verl's own teacher client (``AsyncTeacherLLMServerManager``, in an async worker as its agent loop holds it)
    scores 4 sequences a step: its requests as the teacher pane's counts; from step 3 the server answers none."""
    env = {k: v for k, v in job_env.items() if k != "JOB_HANG_RANK"}
    env.update(JOB_TEACHER="1", JOB_STEPS="4", JOB_TEACHER_STALL_STEP="3")
    with launched(env) as run:
        def owed():
            snap = status_json(run)
            client = snap["state"]["teacher"]["by_src"].get("client:TeacherLoopWorker/0") if snap else None
            return snap if client and client["in_flight"] == 4 else None

        snap = wait_until(owed, 240, "step 3's four requests owed", every_s=0.5)
        client = snap["state"]["teacher"]["by_src"]["client:TeacherLoopWorker/0"]
        assert (client["sent"], client["completed"], client["failed"]) == (12, 8, 0), client
        assert client["latency_ms"]["p50"] > 0
        # the two steps before, each answered whole, as they were said
        said = [(e["sent"], e["completed"]) for e in events(run) if e.get("kind") == "teacher"]
        assert (8, 8) in said, said
        server = snap["state"]["workers"]["TeacherServer/0"]
        assert server["phase"] == "generate" and server["in_flight"] == 4, server

        def named():
            snap = status_json(run)
            return [a for a in (snap["state"]["alerts"].values() if snap else [])
                    if a["code"] == "teacher_owed" and not a.get("cleared")]

        [alert] = wait_until(named, 30, "the owed requests named", every_s=0.5)
        assert alert["targets"] == ["TeacherLoopWorker/0"], alert
        assert alert["message"].startswith("TeacherLoopWorker/0: 4 teacher request(s) in flight for "), alert


def test_verls_checkpoint_engine_sync_in_parts_and_the_slow_one_named_with_its_usual_time(job_env):
    """verl's own ``CheckpointEngineManager.update_weights`` each step, over two rollout servers: a sync in
    its parts (abort, free the KV cache, build the group, send, restore, resume); at step 5 server 1 never
    frees its KV cache: that part named, with its usual time, the manager's step as the driver's phase."""
    env = {k: v for k, v in job_env.items() if k != "JOB_HANG_RANK"}
    env.update(JOB_CHECKPOINT_ENGINE="1", JOB_STEPS="6", JOB_SLOW_RELEASE_STEP="5")
    with launched(env) as run:
        def named():
            snap = status_json(run)
            slow = [a for a in (snap["state"]["alerts"].values() if snap else [])
                    if a["code"] == "sync_part_slow" and not a.get("cleared")]
            return (snap, slow) if slow else None

        snap, [alert] = wait_until(named, 240, "the slow part named", every_s=0.5)
        assert alert["targets"] == ["driver"], alert
        assert alert["evidence"]["part"] == "release_cache" and alert["evidence"]["syncs"] >= 3, alert
        assert "(step 5): free the engines' KV cache" in alert["message"], alert["message"]
        assert "usually" in alert["message"], alert["message"]
        driver = snap["state"]["workers"]["driver"]
        assert driver["phase"] == "release_kv_cache_replicas", driver
        # each sync before it: one sync a step, in its parts, in verl's order (the job's own first push of the
        # weights, a wait on sync_rollout_weights, is a sync too, in no parts)
        in_parts = {e["sync_id"] for e in events(run) if e.get("kind") == "sync_part"}
        done = [e for e in events(run) if e.get("kind") == "sync" and e["state"] == "done" and e["sync_id"] in in_parts]
        assert [e["step"] for e in done] == [1, 2, 3, 4], done
        for sync in done:
            parts = [e["part"] for e in events(run) if e.get("kind") == "sync_part" and e["state"] == "ended"
                     and e["sync_id"] == sync["sync_id"]]
            assert parts == ["pause", "release_cache", "group", "broadcast", "resume_cache", "resume"], parts


VERLS_OWN_TESTS_S = 600  # verl's CPU tests: about 200 s alone here, over 300 beside the vLLM tier (CI runs both)


@pytest.mark.timeout(VERLS_OWN_TESTS_S + 60)  # the suite's 300 s is for one of ours; this bounds verl's whole suite
def test_verls_own_single_controller_tests_pass_with_the_plugin_active(tmp_path):
    """The plugin loaded and asked (a run's variables and Ray's hook set): every CPU test of verl's worker
    groups and decorators (tests/single_controller/*cpu*.py, as verl ships them) passes, and ran with our
    patches in place: asked (verl_probe) in the process that ran them and in every worker of every group they
    made, since a patch that fails to install says so only on stderr and the job runs on unpatched."""
    import verl

    tests = Path(verl.__file__).resolve().parent.parent / "tests" / "single_controller"
    chosen = sorted(str(t) for t in tests.glob("*cpu*.py"))
    assert len(chosen) >= 6, f"verl's CPU tests are not installed beside it ({tests}): {chosen}"
    probe_out = tmp_path / "patches.jsonl"
    # the probe is imported by verl's pytest and, to answer, by each Ray worker (which inherits PYTHONPATH)
    path = os.pathsep.join(p for p in (str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, GKD_REPORT="1", GKD_RUN_ID="verl-own-tests", GKD_INGEST=f"ipc://{tmp_path}/nobody.sock",
               RAY_RUNTIME_ENV_HOOK="gkd_core.integrations.ray_hook.runtime_env_hook", PYTHONPATH=path,
               VERL_PROBE_OUT=str(probe_out))
    got = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "verl_probe",
                          *chosen], capture_output=True, text=True, env=env, timeout=VERLS_OWN_TESTS_S,
                         cwd=tmp_path)
    assert got.returncode == 0, got.stdout[-4000:]
    assert " passed" in got.stdout and " failed" not in got.stdout

    reports = [json.loads(line) for line in probe_out.read_text().splitlines()]
    [tests_process] = [r for r in reports if r["where"] == "tests"]
    workers = [r for r in reports if r["where"] == "worker"]
    assert tests_process["part"] == "driver" and tests_process["verl_plugin"], tests_process
    # verl's timers and metrics (its plugin), Ray's calls and waits (our Ray part) everywhere; an actor's methods
    # in the workers, which host the actors
    everywhere = {"verl _timer": "verl", "verl Tracking.log": "verl", "ray ActorClass._remote": "ray_hook",
                  "ray ActorMethod._remote": "ray_hook", "ray.get": "ray_hook", "ray.wait": "ray_hook"}
    in_workers = {**everywhere, "ray actor methods": "ray_hook"}
    assert tests_process["patched"] == {**everywhere, "ray actor methods": ""}, tests_process
    # verl's test files make 7 worker groups of 2 to 4 workers (20 in all), each worker a process of its own
    assert len({r["group"] for r in workers}) >= 6 and len({r["pid"] for r in workers}) == len(workers) >= 10, workers
    for r in workers:
        assert r["part"] == "worker" and r["verl_plugin"] and r["patched"] == in_workers, r
        assert r["pid"] != tests_process["pid"], r
    # nor did any part of ours say it failed (on stderr, where a failed install is said)
    assert "gkd:" not in got.stdout + got.stderr, "a part of ours said it failed: " + (got.stdout + got.stderr)[-3000:]


def test_verls_pool_that_can_never_be_placed_through_the_ray_state_api_alone(job_env):
    """verl's RayResourcePool with its default max_colocate_count=10 on a 4-CPU node: `attach --ray-address
    auto --plain` says within 30 s that it asks for what no node has; no run, no gkd in the job."""
    env = {k: v for k, v in job_env.items() if not k.startswith("GKD_") and k != "RAY_RUNTIME_ENV_HOOK"}
    env.update(JOB_MAX_COLOCATE="10", JOB_DASHBOARD="1", JOB_HANG_RANK="-1")
    job = subprocess.Popen([sys.executable, str(JOB)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        read_until(job, "asking for the pool")
        t0 = time.monotonic()

        def said():
            out = attach_plain(env)
            return out if "can never be placed" in out else None

        out = wait_until(said, 60, "attach --plain says the pool can never be placed", every_s=2)
        assert time.monotonic() - t0 < 30
        assert "it asks for {CPU 10} × 2" in out and "no node has CPU 10 (the largest of 1 node has CPU 4)" in out
        assert "max_colocate_count" in out  # the hint names verl's knob
    finally:
        os.killpg(job.pid, 9)
        job.wait(30)


def test_a_verl_job_started_by_its_user_that_opts_in_is_a_run_of_its_own(job_env, gkd_home):
    """`GKD_WATCH=1 python job.py`: verl's plugin starts the run at `import verl` (no Ray hook to set)."""
    job, run = opted_in([sys.executable, str(JOB)], job_env)
    try:
        def named():
            snap = status_json(run)
            alerts = snap["state"]["alerts"].values() if snap else []
            return snap if [a for a in alerts if a["code"] == "straggler"
                            and a["targets"] == ["ActorRolloutWorker/1"] and not a.get("cleared")] else None

        snap = wait_until(named, 180, "rank 1 named by its peer in the job's own run", every_s=0.25)
        assert f"watching pid {job.pid}" in snap["state"]["reason"]
        assert snap["state"]["workers"]["driver"]["phase"] == "update_weights"
        assert snap["sync_view"]["pending"] == ["ActorRolloutWorker/1"]
    finally:
        os.killpg(job.pid, 9)
        job.wait(30)
    assert wait_until(lambda: (status_json(run) or {}).get("state", {}).get("state") in ("finished", "failed"), 30,
                      "the run's end once the job is gone", every_s=0.5)
    gkd_tui("stop", str(run))
