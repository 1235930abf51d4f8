"""The bug report's parts on their own: which variables are kept and which hidden, the scrubbing of a
stream, the tracebacks found in a log, the summary written from a state (tests/ray/test_bundle.py: all
of it on a real stuck job)."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from gkd_core.bundle import StacksTaken, archive, environment, report
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev


@pytest.mark.parametrize("name,value,hidden", [
    ("NCCL_DEBUG", "INFO", False),
    ("GKD_RUN_DIR", "/home/someone/.gkd/runs/20261127-092859-5b6f-with-a-long-name-of-its-own", False),
    ("RAY_AUTH_MODE", "token", False),  # a choice, not a secret
    ("HF_TOKEN", "anything", True),  # the name says so
    ("WANDB_API_KEY", "x" * 40, True),
    ("NCCL_SOCKET_IFNAME", "hf_abcdefghijklmnopqrst", True),  # the value looks like a token
    ("TORCH_EXTRA", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig", True),  # a JWT
    ("VLLM_SOMETHING", "a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8", True),  # a long run of letters and digits
    ("RAY_AUTH_TOKEN_PATH", "/home/someone/.ray/auth_token", False),  # where the token is, not the token
    ("NCCL_IB_PKEY", "0x8001", False),
    ("HF_ENDPOINT", "https://bob:hunter2@mirror.example/", True),  # a URL's password
    ("DB_PASS", "short", True),
])
def test_a_value_is_hidden_when_its_name_or_its_look_says_secret(name, value, hidden):
    assert bool(environment.why_secret(name, value)) is hidden


def test_only_the_variables_that_shape_a_run_are_kept_with_secrets_replaced():
    shown, why = environment.shaping_env({"NCCL_DEBUG": "INFO", "HOME": "/root", "HF_TOKEN": "hf_" + "a" * 20,
                                          "PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0,1", "AWS_SECRET": "s" * 30})
    assert shown == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "<redacted>", "NCCL_DEBUG": "INFO"}
    assert why == {"HF_TOKEN": "its name says it is a secret"}
    # every secret of any name is known, to be scrubbed from the files a bundle takes in
    assert environment.secret_values({"AWS_SECRET": "s" * 30, "X": "url?key=ghp_" + "b" * 20, "N": "4"}) == \
        {"s" * 30, "ghp_" + "b" * 20}


def test_the_driver_record_is_private_and_read_back(tmp_path):
    rec = environment.record_driver(tmp_path, ["python3.11", "job.py"], {"NCCL_DEBUG": "WARN", "GKD_KEY": "k" * 9},
                                    pid=7, restart=1, how="command", cwd="/work")
    assert oct((tmp_path / "driver.json").stat().st_mode & 0o777) == "0o600"
    back = environment.read_driver(tmp_path)
    assert back == rec and back.python.endswith("python3.11")
    assert back.env == {"GKD_KEY": "<redacted>", "NCCL_DEBUG": "WARN"}
    assert environment.python_of(["bash", "-c", "x"]).endswith(("python", "python3", "python3.11"))
    rec = environment.record_driver(tmp_path, ["python", "job.py", "--token", "t0ps3cret"], {}, pid=8, restart=0,
                                    how="command")
    assert rec.argv == ["python", "job.py", "--token", "<redacted>"] and rec.python.endswith("python")
    (tmp_path / "driver.json").write_text("{not json")
    assert environment.read_driver(tmp_path) is None


def test_a_secret_across_two_chunks_is_scrubbed_and_so_is_what_looks_like_a_token(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "SCRUB_CHUNK", 16)
    monkeypatch.setattr(archive.Scrubber, "HOLD", 8)
    secret = "s3cret-Value-0123456789"
    token = "hf_" + "Ab1" * 12  # in no variable this machine knows: its look is enough
    path = tmp_path / "log"
    path.write_bytes(b"x" * 10 + secret.encode() + b"\n" + b"y" * 13 + secret.encode() + b" token " + token.encode()
                     + b" end")
    copy, size = archive.Scrubber({secret}).file(path, 1 << 20)
    data = copy.read()
    assert size == len(data)
    assert data == b"x" * 10 + b"<redacted>\n" + b"y" * 13 + b"<redacted> token <redacted> end"


def test_a_token_typed_on_the_command_line_is_hidden_and_known():
    shown, found = environment.redact_argv(["python", "train.py", "--api-key", "abc123secret", "--lr", "1e-5",
                                            "--hf-token=xyz987secret", "https://u:pw@host/x", "--key-file", "k.pem"])
    assert shown == ["python", "train.py", "--api-key", "<redacted>", "--lr", "1e-5", "--hf-token=<redacted>",
                     "https://<redacted>@host/x", "--key-file", "k.pem"]
    assert found == {"abc123secret", "xyz987secret", "u:pw"}


def tracebacks_in(tmp_path, log: str, text: str) -> list[tuple[str, str]]:
    """The tracebacks found in RUN/logs holding one file, ``log``, of ``text``."""
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / log).write_text(text)
    return report.tracebacks(logs)


def test_tracebacks_are_found_whole_in_the_logs_newest_last(tmp_path):
    found = tracebacks_in(
        tmp_path, "driver.log",
        "starting\n"
        "Traceback (most recent call last):\n"
        '  File "job.py", line 3, in <module>\n'
        "    main()\n"
        "ValueError: bad config\n"
        "more output\n"
        "(Trainer pid=12) Traceback (most recent call last):\n"
        '(Trainer pid=12)   File "t.py", line 9, in step\n'
        "ray.exceptions.RayTaskError: boom\n")
    assert [f for f, _ in found] == ["logs/driver.log", "logs/driver.log"]
    assert found[0][1].splitlines()[-1] == "ValueError: bad config" and "more output" not in found[0][1]


def test_the_summary_reads_as_an_issue(tmp_path):
    st = RunState()
    t = 1000.0
    for e in (ev.RunEvent(state="running", ts=t),
              ev.WorkerEvent(src="Trainer/0", role="Trainer", rank=0, node="n1", pid=42, actor_id="a" * 32, ts=t),
              ev.PhaseEvent(src="Trainer/0", phase="step", started=t, ts=t),
              ev.AlertEvent(severity="critical", code="deadlock", message="deadlock: Trainer/0.step waits for X",
                            hint="stop one side", targets=["Trainer/0"], ts=t + 20)):
        st.apply(e)
    st.actions.append(ev.ActionEvent(op="cancel", by="cli", ok=True, result="sent", ts=t + 30))
    driver = environment.DriverRecord(argv=["python", "job.py", "--lr", "1e-5"], pid=9, how="command",
                                      env={"NCCL_DEBUG": "INFO"})
    facts = {"versions": {"python": "3.11.7", "torch": "2.13.0", "torch_build": {"cuda": None, "nccl": "none"}},
             "hardware": {"cpus": 2, "cpus_usable": 2, "memory_total": 8 << 30, "memory_available": 4 << 30,
                          "memory_limit": {"where": "node", "limit": 8 << 30},
                          "gpus": {"none": "no NVIDIA driver on this node", "devices": []}}}
    stacks = StacksTaken(dump_id="d1", folder="stacks/d1", taken={
        "Trainer/0": 'Thread 1 (active): "MainThread"\n    step (job.py:12)\n    ray.get (ray/_private/worker.py:9)'})
    text = report.summary(tmp_path, st, t + 40, driver, facts, stacks, [("logs/driver.log", "Traceback\nE: x")],
                          ["summary.md", "stacks.txt"])
    assert text.splitlines()[0] == f"# {tmp_path.name}: deadlock: Trainer/0.step waits for X"
    assert "- **critical** `deadlock`: deadlock: Trainer/0.step waits for X — stop one side" in text
    assert "| Trainer/0 | step | 40s | n1 | 42 |" in text and "job.py:12" in text
    assert "`cancel` by cli: ok — sent" in text
    assert "python job.py --lr 1e-05" in text or "python job.py --lr 1e-5" in text
    assert "NCCL_DEBUG=INFO" in text and "none: no NVIDIA driver on this node" in text
    assert "1 actor(s) (1 ALIVE)" in text and "E: x" in text and "- `stacks.txt`" in text


def test_the_archive_is_private_and_never_holds_keys_or_checkpoints(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "run_probe", lambda *a, **k: {"versions": {}, "hardware": {}})
    run = tmp_path / "run"
    for d in ("logs", "keys", "checkpoints/step_1"):
        (run / d).mkdir(parents=True)
    (run / "keys" / "control.key_secret").write_text('metadata\ncurve\n    public-key = "' + "p" * 40 + '"\n'
                                                      '    secret-key = "' + "k" * 40 + '"\n')
    (run / "checkpoints" / "step_1" / "model.pt").write_bytes(b"\0" * 10)
    (run / "logs" / "driver.log").write_text("the key is " + "k" * 40 + "; metadata stays\n")
    (run / "config.yaml").write_text("trainer: {}\n")
    (tmp_path / "b.tar.gz").write_bytes(b"an older file, world-readable")
    (tmp_path / "b.tar.gz").chmod(0o644)
    out = archive.write_bundle(run, tmp_path / "b.tar.gz", status="ok")
    assert oct(out.stat().st_mode & 0o777) == "0o600" and not list(tmp_path.glob("*.part"))
    with tarfile.open(out) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames()]
        log = tar.extractfile(next(m for m in tar.getmembers() if m.name.endswith("driver.log"))).read()
    assert not [n for n in names if n.startswith(("keys", "checkpoints"))]
    assert {"summary.md", "environment.json", "ray.json", "stacks.txt", "tracebacks.txt", "status.txt",
            "config.yaml", "logs/driver.log"} <= set(names)
    assert log == b"the key is <redacted>; metadata stays\n"


def test_a_chained_traceback_is_one(tmp_path):
    [(_, text)] = tracebacks_in(
        tmp_path, "w.log",
        "Traceback (most recent call last):\n  File \"a.py\", line 1, in f\nKeyError: 'x'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        "Traceback (most recent call last):\n  File \"a.py\", line 2, in g\nRuntimeError: wrapped\nafter\n")
    assert text.splitlines()[-1] == "RuntimeError: wrapped" and "KeyError: 'x'" in text


def test_the_bundle_takes_what_its_dump_missed_and_says_why_not_where_it_cannot():
    """Issue #54 (11): the union of the run's live workers, read again (those that joined while the bundle was
    made), and every ALIVE actor of Ray's view that no target is yet; each other one says why it is not taken."""
    from gkd_core.bundle import targets

    st = RunState()
    for e in (ev.WorkerEvent(src="driver", role="driver", node="here-host", pid=10, ts=1.0),
              ev.WorkerEvent(src="Learner/0", role="Learner", rank=0, node="here-host", pid=11, actor_id="a0" * 16),
              ev.WorkerEvent(src="Learner/1", role="Learner", rank=1, node="here-host", pid=12, actor_id="a1" * 16),
              ev.WorkerEvent(src="Learner/2", role="Learner", rank=2, node="other-host", pid=13, actor_id="a2" * 16),
              ev.WorkerEvent(src="Learner/3", role="Learner", rank=3, node="here-host", pid=14, actor_id="a3" * 16),
              ev.PhaseEvent(src="Learner/3", phase="exited", ts=2.0)):
        st.apply(e)
    # the dump named the driver and Learner/0 alone: Learner/1 and Learner/2 joined after it was asked
    dump = StacksTaken(dump_id="d", folder="stacks/d", taken={"driver": "x", "Learner/0": "y"})
    nodes = [{"node_id": "n-here", "node_ip": "10.0.0.1", "here": True},
             {"node_id": "n-other", "node_ip": "10.0.0.2", "here": False}, {"node_id": "n-old", "node_ip": "10.0.0.3"}]

    def actor(cls, actor_id, pid, node="n-here", state="ALIVE", name="", job="01000000"):
        return {"class": cls, "name": name, "actor_id": actor_id, "state": state, "node_id": node, "pid": pid,
                "job_id": job}

    ray = {"nodes": nodes, "actors": [
        actor("Learner", "a0" * 16, 11), actor("Learner", "a1" * 16, 12),  # the run's own, by their actor id
        actor("Learner", "b0" * 16, 21), actor("Learner", "b1" * 16, 22, name="spare"),  # alive, never reported
        actor("Learner", "b2" * 16, 23, node="n-other"), actor("Learner", "b3" * 16, 0),  # elsewhere; no pid yet
        actor("Learner", "b4" * 16, 24, node="n-old"),  # a node Ray's view says nothing of
        actor("Learner", "b5" * 16, 25, state="DEAD"), actor("GkdStacksHelper", "c0" * 16, 26),  # gone; ours
        actor("Learner", "b6" * 16, 10),  # the driver's pid on this machine: already a target
        actor("Evaluator", "d0" * 16, 31, job="02000000")]}  # another job's, on a shared cluster: left alone
    got = targets.missed(dump, st, ray, host="here-host")
    assert got.pids == {"Learner/1": 12, "Learner pid 21": 21, "Learner 'spare' pid 22": 22}
    assert set(got.missing) == {"Learner/2", "Learner pid 23", f"Learner {'b3' * 4}", "Learner pid 24"}
    assert "on other-host: `py-spy dump --native --pid 13` there" in got.missing["Learner/2"]
    assert got.missing["Learner pid 23"].startswith("it runs on 10.0.0.2, not on this machine")
    assert "no pid yet" in got.missing[f"Learner {'b3' * 4}"]
    assert "does not say whether 10.0.0.3 is this machine" in got.missing["Learner pid 24"]
    assert [(a.target, a.pid, a.node) for a in got.unreported][:2] == [
        (f"Learner {'b3' * 4}", 0, "10.0.0.1"), ("Learner pid 21", 21, "10.0.0.1")]
    assert len(got.unreported) == 5
    # Ray's view not read: the workers that joined are still taken
    assert targets.missed(dump, st, {"error": "no dashboard"}, host="here-host").pids == {"Learner/1": 12}

    # the summary lists the actors Ray's view alone has, and says why one was not taken
    stacks = StacksTaken(dump_id="d", folder="stacks/d", taken={"driver": "x", "Learner pid 21": "y"},
                         missing={"Learner pid 23": got.missing["Learner pid 23"]}, unreported=got.unreported[1:4])
    text = report.summary(Path("run"), st, 5.0, None, {}, stacks, [], [])
    assert "| Learner pid 21 | (not reported to the run) | | 10.0.0.1 | 21 |" in text
    row = next(ln for ln in text.splitlines() if ln.startswith("| Learner pid 23 |"))
    assert "`not taken: it runs on 10.0.0.2, not on this machine" in row
    assert "3 actor(s) alive in Ray's view had not reported to the run" in text
