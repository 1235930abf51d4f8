"""The supervisor as a real process, with real sockets, a real driver child and real subscribers."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import zmq
from conftest import wait_until

from gkd_core.runlog.reader import replay
from gkd_core.subscriber import RunSubscriber
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ingest, ops
from gkd_core.telemetry.control import ControlClient, ControlError, ControlUnreachable
from gkd_core.telemetry.reporter import Reporter

pytestmark = pytest.mark.slow


def log_state(sup):
    return replay((sup.run / "events.jsonl").read_bytes().splitlines())


def pump_until_caught_up(subs, sup, timeout_s=30.0):
    """Pump every subscriber until the supervisor has exited and each has applied the last logged event."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for s in subs:
            s.pump(0.01)
        if sup.proc.poll() is not None:
            last = log_state(sup).last_seq
            if all(s.seq == last for s in subs):
                return
    raise AssertionError(f"subscribers at {[s.seq for s in subs]}, log at {log_state(sup).last_seq}")


def test_three_late_joiners_and_a_lossy_one_all_equal_the_log(start_supervisor):
    # every heartbeat in the log, so the log is the whole stream (test_heartbeat_log: the thinned one)
    sup = start_supervisor("trainer.total_steps=100000", "telemetry.pub_hwm=50", "telemetry.heartbeat_log_s=0",
                           step_s=0.05)
    subs = [RunSubscriber(sup.run)]
    subs[0].connect()
    lossy = RunSubscriber(sup.run, rcvhwm=100)  # against a burst of 30 000
    lossy.connect()
    for t_join in (0.7, 1.4):
        end = time.monotonic() + t_join
        while time.monotonic() < end:
            for s in subs:
                s.pump(0.01)
        late = RunSubscriber(sup.run)
        late.connect()
        subs.append(late)
    assert [s.gaps for s in subs] == [0, 0, 0]  # at the run's own pace nobody misses anything
    # room for the whole burst on the way in (the drops under test are the PUB socket's, on the way out;
    # a busy machine must not turn them into drops at the sender)
    flood = Reporter("flood/0", ingest=sup.endpoints["ingest"], heartbeat_s=1.0, queue_max=100_000,
                     sndhwm=100_000)
    for i in range(30_000):  # the lossy one reads nothing meanwhile, so the PUB socket drops for it
        flood.emit(ev.LogEvent(message=f"burst {i}"))
    flood.close(timeout_s=10)
    assert flood.dropped == 0
    with sup.client() as c:
        after_burst = wait_until(lambda: (seq := c.request("ping")["seq"]) > 30_000 and seq, 30, "the burst logged")
        deadline = time.monotonic() + 30
        while lossy.seq < after_burst and time.monotonic() < deadline:
            for s in subs + [lossy]:
                s.pump(0.01)
        c.request("stop")
    pump_until_caught_up(subs + [lossy], sup)
    assert sup.wait_exit() == 143
    want = log_state(sup)
    assert want.state == "stopped" and want.step > 10
    for s in subs + [lossy]:
        assert s.state == want
    assert lossy.gaps >= 1 and lossy.snapshots >= 2


def test_answers_while_driver_is_stopped_and_reports_its_kill(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", "telemetry.stall_s=1", step_s=0.05)
    pid = sup.wait_driver()
    os.kill(pid, signal.SIGSTOP)
    try:
        with sup.client(timeout_s=1.0, retries=0) as c:
            worst = 0.0
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                for op in ("ping", "snapshot"):
                    t0 = time.monotonic()
                    c.request(op)
                    worst = max(worst, time.monotonic() - t0)
                time.sleep(0.1)
            assert worst < 1.0
            alerts = c.request("snapshot")["state"]["alerts"]
            assert any(a["code"] == "heartbeat_stale" and a["targets"] == ["driver"] for a in alerts.values())
    finally:
        os.kill(pid, signal.SIGCONT)
    t_kill = time.time()
    os.kill(pid, signal.SIGKILL)

    def failed():
        for e in sup.events():
            if e["kind"] == "run" and e["state"] == "failed":
                return e
    e = wait_until(failed, 5.0, "a failed run event")
    assert e["ts"] - t_kill < 2.0
    assert e["exit_code"] == -9 and "SIGKILL" in e["reason"]
    assert sup.wait_exit() == 128 + 9


def test_sigkill_of_a_subscriber_does_not_disturb_the_run(start_supervisor):
    sup = start_supervisor("trainer.total_steps=30", step_s=0.05)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gkd_core.subscriber import RunSubscriber
        s = RunSubscriber(Path({str(sup.run)!r}))
        s.connect()
        print("ready", flush=True)
        while True:
            s.pump(0.1)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"ready"
        time.sleep(0.3)
    finally:
        child.kill()  # the SIGKILL under test, and never a subscriber left behind
        child.wait()
    with sup.client(timeout_s=1.0) as c:
        assert c.call(ops.PingArgs()).pid > 0  # (the answer typed as the op declares it: telemetry/answers)
    assert sup.wait_exit(60) == 0
    assert log_state(sup).state == "finished"


def test_bad_messages_on_ingest_are_counted_and_dropped(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    ctx = zmq.Context.instance()
    push = ctx.socket(zmq.PUSH)
    push.linger = 1000
    push.connect(sup.endpoints["ingest"])
    push.send(b"\x00\x01 not json at all")
    push.send_multipart([b"phase", b'{"v":1,"kind":"phase","phase":42}'])
    push.send_multipart([b"log", b'{"v":1,"kind":"log","message":"' + b"x" * (2 << 20) + b'"}'])
    push.send_multipart([b"phase", b'{"v":7,"kind":"phase","phase":"train"}'])
    push.send_multipart([b"log", b'{"v":1,"kind":"log","src":"probe","message":"still here"}'])
    push.close()
    with sup.client() as c:
        def counted():
            s = c.request("snapshot")
            return s if sum(s["supervisor"]["rejected"].values()) == 4 else None
        snap = wait_until(counted, 10.0, "four rejections")
        assert snap["supervisor"]["rejected"] == {"garbage": 1, "malformed": 1, "oversized": 1, "version": 1}
        assert c.request("ping")["answer"] == "ping"
        wait_until(lambda: any(a["code"] == "ingest_rejected"
                               for a in c.request("snapshot")["state"]["alerts"].values()),
                   5.0, "an ingest_rejected alert")
    wait_until(lambda: any(e["kind"] == "log" and e.get("message") == "still here" for e in sup.events()), 2.0,
               "the good event after the bad ones in the log")


def test_tcp_ingest_for_other_nodes_lets_in_only_the_run_key(start_supervisor):
    """The ingest the driver opens for workers on other nodes: never on every interface; a sender
    without the run's key (none, or a key of its own) is refused in the handshake and counted,
    and nothing it sends is recorded; the run's key gets through."""
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    with sup.client() as c:
        for host, why in (("0.0.0.0", "every interface"), ("node-1", "not an IP address")):
            with pytest.raises(ControlError, match=why):
                c.request("open_ingest", {"host": host})
        endpoint = c.call(ops.OpenIngestArgs(host="127.0.0.1")).endpoint
        assert endpoint.startswith("tcp://127.0.0.1:") and c.request("open_ingest", {"host": "127.0.0.1"}) == {
            "answer": "open_ingest", "endpoint": endpoint}
    keys = sup.run / "keys"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in keys.rglob("ingest*.key*"))
    own = zmq.curve_keypair()
    strangers = [None, ingest.Curve(server_public=ingest.client_keys(keys).server_public,
                                    public=own[0].decode(), secret=own[1].decode())]
    forged = ev.AlertEvent(src="stranger", severity="critical", code="forged", message="stop this run")
    for curve in strangers:
        with Reporter("stranger", ingest=endpoint, run=sup.run.name, heartbeat_s=60, curve=curve) as r:
            r.emit(forged)
            r.emit(ev.RunEvent(state="failed", reason="forged"))
            time.sleep(0.5)
    with Reporter("node2/worker", ingest=endpoint, run=sup.run.name, heartbeat_s=60,
                  curve=ingest.client_keys(keys)) as r:
        r.log("from another node")
    wait_until(lambda: any(e.get("message") == "from another node" for e in sup.events()), 5.0,
               "the run key's event in the log")
    with sup.client() as c:
        snap = c.request("snapshot")
        assert snap["supervisor"]["rejected"].get("unauthenticated", 0) >= 2, snap["supervisor"]
        assert "forged" not in msgspec.json.encode(snap["state"]).decode()
        assert c.request("ping")["answer"] == "ping"
    assert not [e for e in sup.events() if e.get("src") == "stranger" or e.get("reason") == "forged"]


def test_tcp_control_needs_the_run_key(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", "telemetry.control_tcp=127.0.0.1:*", step_s=0.05)
    addr = sup.endpoints["control_tcp"]
    assert addr.startswith("tcp://127.0.0.1:")
    for p in (sup.run / "keys").rglob("*"):
        if p.is_file():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600
    with ControlClient(addr, keys_dir=sup.run / "keys", timeout_s=2.0) as good:
        assert good.request("ping")["answer"] == "ping"

    stranger = sup.run.parent / "stranger"
    stranger.mkdir()
    import zmq.auth
    zmq.auth.create_certificates(str(stranger), "client")
    (stranger / "server.key_secret").write_bytes((sup.run / "keys" / "server.key_secret").read_bytes())
    with ControlClient(addr, keys_dir=stranger, timeout_s=0.5, retries=1) as bad:
        with pytest.raises(ControlUnreachable):
            bad.request("stop")
    plain = zmq.Context.instance().socket(zmq.DEALER)
    plain.linger = 0
    plain.connect(addr)
    plain.send_multipart([b"", msgspec.json.encode({"op": "stop"})])
    assert not plain.poll(500)
    plain.close()

    def refused():
        return [e for e in sup.events() if e["kind"] == "action" and e["op"] == "connect" and not e["ok"]]
    wait_until(refused, 5.0, "a refused connection on the record")
    with sup.client() as c:
        assert c.request("snapshot")["state"]["state"] == "running"  # the run was not stopped


def test_restart_on_request_writes_the_smaller_config_first(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", "rollout.n_workers=4", step_s=0.05)
    first = sup.wait_driver()
    with sup.client() as c:
        dry = c.request("restart", {"shrink": True, "dry_run": True})
        # nothing diagnosed: the config's own shrink rules, and each line says so
        assert ["rollout.n_workers", 4, 2, "nothing diagnosed: the config's shrink rules"] in dry["changes"]
        assert not (sup.run / "restarts" / "001.yaml").exists()
        res = c.request("restart", {"shrink": True, "overrides": ["trainer.sync_timeout_s=30"]})
    assert res["config"] == "restarts/001.yaml"
    text = (sup.run / "restarts" / "001.yaml").read_text()
    assert "n_workers: 2" in text and "sync_timeout_s: 30" in text

    def restarted():
        return [e for e in sup.events() if e["kind"] == "run" and e["state"] == "running" and e["restart"] == 1]
    wait_until(restarted, 20.0, "the driver running again as restart 1")
    second = sup.wait_driver()
    assert second != first
    actions = [e for e in sup.events() if e["kind"] == "action" and e["op"] == "restart"]
    assert actions and actions[-1]["ok"]
    with pytest.raises(ProcessLookupError):
        os.kill(first, 0)


def test_control_refuses_malformed_and_unknown_requests_on_the_record(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    d = zmq.Context.instance().socket(zmq.DEALER)
    d.linger = 0
    d.connect(sup.endpoints["control"])
    d.send_multipart([b"", b"{{{ not json"])
    assert d.poll(2000)
    reply = msgspec.json.decode(d.recv_multipart()[-1])
    assert reply["ok"] is False and "malformed" in reply["error"]
    d.send_multipart([b"", msgspec.json.encode({"op": "format_disk", "id": 5})])
    assert d.poll(2000)
    reply = msgspec.json.decode(d.recv_multipart()[-1])
    assert reply["ok"] is False and "unknown op" in reply["error"] and reply["id"] == 5
    d.close()
    wait_until(lambda: len([e for e in sup.events() if e["kind"] == "action" and not e["ok"]]) == 2, 5.0,
               "both refusals on the record")


def test_a_cancel_or_a_dump_of_a_worker_the_run_does_not_have_is_refused_naming_those_it_has(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    wait_until(lambda: any(e["kind"] == "worker" and e["src"] == "driver" for e in sup.events()), 10,
               "the driver to register")
    with sup.client() as c:
        with pytest.raises(ControlError) as refused:
            c.request("cancel", {"target": "rollout/99"})
        assert str(refused.value) == ("cancel: no worker 'rollout/99' in this run; its workers: driver, "
                                      "or 'sync', or 'all'")
        with pytest.raises(ControlError) as refused:
            c.request("dump_stacks", {"targets": ["driver", "rollout/99"]})
        assert str(refused.value) == "dump_stacks: no worker 'rollout/99' in this run; its workers: driver"
        assert c.request("cancel", {"target": "sync"})["forwarded"]  # the words a cancel knows still go
    def refused():  # both on the record (the log is flushed every 100 ms: the second may come a flush later)
        said = [e for e in sup.events() if e["kind"] == "action" and not e["ok"]
                and "no worker 'rollout/99'" in str(e["result"])]
        return said if len(said) >= 2 else None
    refusals = wait_until(refused, 5.0, "the two refusals on the record")
    assert [e["op"] for e in refusals] == ["cancel", "dump_stacks"]


def test_forwarded_dump_stacks_comes_back_as_a_stack_event(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    with sup.client() as c:
        assert c.request("dump_stacks", {"targets": []})["forwarded"]
    stack = wait_until(lambda: [e for e in sup.events() if e["kind"] == "stack"], 5.0, "a stack event")[0]
    assert stack["target"] == "driver" and "serve_commands" in stack["text"]


def test_stop_ends_the_run_and_files_are_private(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    sup.wait_driver()
    assert stat.S_IMODE((sup.run / "endpoints.json").stat().st_mode) == 0o600
    for key in ("events", "control", "ingest"):  # no other user can connect, nor push an event
        path = sup.endpoints[key].removeprefix("ipc://")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    r = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(sup.run)], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert sup.wait_exit(30) == 143
    states = [e["state"] for e in sup.events() if e["kind"] == "run"]
    assert states[0] == "starting" and states[-1] == "stopped"
    seqs = [e["seq"] for e in sup.events()]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_run_whose_supervisor_was_killed_is_taken_over_by_restart(start_supervisor, gkd_home):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    driver = sup.wait_driver()
    wait_until(lambda: any(e["kind"] == "metrics" for e in sup.events()), 20, "a step")
    cli = [sys.executable, "-m", "gkd_tui.cli"]
    os.kill(sup.proc.pid, signal.SIGKILL)
    sup.proc.wait(10)
    wait_until(lambda: gone(driver), 10, "the driver to end with its supervisor")
    with open(sup.run / "events.jsonl", "ab") as f:
        f.write(b'{"v":1,"seq":999999,"kind":"log","mess')  # killed in the middle of a line
    lines_before = (sup.run / "events.jsonl").read_bytes().split(b"\n")[:-1]
    # a checkpoint newer than the log's steps: what a supervisor killed while behind leaves (the demo driver
    # saves none; the trainer's chaos test makes a real one)
    (sup.run / "checkpoints" / "step_000900").mkdir(parents=True)
    (sup.run / "checkpoints" / "step_000900" / "COMPLETE").write_text("")

    r = subprocess.run([*cli, "status", str(sup.run)], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "is gone: `gkd-tui restart" in r.stderr, r.stderr
    r = subprocess.run([*cli, "restart", str(sup.run)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "took the run over" in r.stderr, r.stderr
    new_pid = json_endpoints(sup.run)["supervisor_pid"]
    try:
        # the same run goes on: its log continued (the torn line set aside), a driver running
        wait_until(lambda: any(e["kind"] == "metrics" and e["seq"] > len(lines_before) for e in sup.events()), 30,
                   "a step of the new driver")
        raw = (sup.run / "events.jsonl").read_bytes().split(b"\n")
        assert raw[:len(lines_before)] == lines_before, "what was recorded is kept as it was"
        assert (sup.run / "events.jsonl.torn").read_bytes().startswith(b'{"v":1,"seq":999999')
        seqs = [e["seq"] for e in sup.events()]
        assert seqs == list(range(1, len(seqs) + 1))
        taken = [e for e in sup.events() if e["kind"] == "run" and e["state"] == "restarting"]
        assert taken and f"pid {sup.proc.pid}) was gone" in taken[0]["reason"] and taken[0]["restart"] == 1
        assert (sup.run / "restarts" / "001.yaml").exists()
        logged = max(e["step"] for e in sup.events() if e["kind"] == "metrics" and e["seq"] < taken[0]["seq"])
        said = [e for e in sup.events() if e["kind"] == "log" and e["message"].startswith("the log lost")]
        assert said and said[0]["level"] == "warn" and said[0]["seq"] == taken[0]["seq"] + 1, said
        assert said[0]["message"].startswith(f"the log lost steps {logged + 1}-899: checkpoint step_000900"), said
        # a second supervisor for a run that has one is refused
        r = subprocess.run([sys.executable, "-m", "gkd_core", "run", "--resume", str(sup.run)], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 2 and f"its supervisor (pid {new_pid}) is still running" in r.stderr, r.stderr
        r = subprocess.run([*cli, "stop", str(sup.run)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        wait_until(lambda: gone(new_pid), 30, "the new supervisor to exit")
        assert [e["state"] for e in sup.events() if e["kind"] == "run"][-1] == "stopped"
    finally:
        if not gone(new_pid):
            os.kill(new_pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def json_endpoints(run):
    import json

    return json.loads((run / "endpoints.json").read_text())


def test_an_invalid_config_starts_nothing(gkd_home):
    r = subprocess.run([sys.executable, "-m", "gkd_core", "run", "trainer.total_step=5"], capture_output=True,
                       text=True, timeout=30, env=dict(os.environ, GKD_HOME=str(gkd_home)))
    assert r.returncode == 2
    assert "trainer.total_step" in r.stderr and "did you mean 'trainer.total_steps'" in r.stderr
    assert not (gkd_home / "runs").exists()


def test_the_supervisor_imports_neither_torch_nor_ray():
    code = ("import sys, gkd_core.__main__, gkd_core.supervisor.supervisor, gkd_tui.cli; "
            "bad = [m for m in ('torch', 'ray', 'textual') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
