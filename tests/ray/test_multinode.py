"""Two real Ray nodes on this machine, each in its own network namespace (10.77.0.1 and 10.77.0.2,
joined by a veth pair, no other route): a gkd run with its student on the head and its rollouts
and teacher on the second node. Every worker's events must reach the supervisor, stacks must come
from both nodes, a frozen worker on the second node is named as on the head, and a process without
the run's key cannot add an event from either namespace. And a plain Ray job under ``launch --`` on the
same two nodes, the second made a machine of its own (it cannot see the run's folder or sockets): its
actor there reports over the tcp ingest, is named, and its stack is taken on its node.

Needs root (namespaces, veth); skipped with the reason where they cannot be made.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ROOT, logged_events, wait_until

from gkd_core.supervisor import local_stacks

pytestmark = pytest.mark.slow

SUFFIX = f"{os.getpid() % 100000}"
NS = {"head": f"gkdh{SUFFIX}", "node2": f"gkdn{SUFFIX}"}
IP = {"head": "10.77.0.1", "node2": "10.77.0.2"}
GCS_PORT = 6391


def sh(*argv: str, timeout: float = 60, check: bool = True, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=check, env=env)


def in_ns(node: str, *argv: str) -> list[str]:
    return ["ip", "netns", "exec", NS[node], *argv]


def namespace_of(pid: int) -> str:
    return sh("ip", "netns", "identify", str(pid), check=False).stdout.strip()


def cannot(why: str) -> None:
    """Where the test bed cannot be made: a skip that says why, or, where it must run (CI, as root:
    GKD_REQUIRE_NAMESPACES=1), a failure."""
    if os.environ.get("GKD_REQUIRE_NAMESPACES") == "1":
        pytest.fail(f"GKD_REQUIRE_NAMESPACES=1, and {why}")
    pytest.skip(why)


def stop_namespaces(names: list[str], grace_s: float = 10.0) -> None:
    """End every process in these network namespaces (the Ray nodes this test started in them, and
    nothing else), SIGTERM first, SIGKILL what is left after ``grace_s``."""
    def pids() -> list[int]:
        return [int(p) for ns in names for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids() and time.monotonic() < deadline:
            time.sleep(0.2)


@contextlib.contextmanager
def cluster_of_two(monkeypatch, hidden: tuple[str, ...] = ()):
    """A Ray head (resource ``head``) in one namespace and a Ray worker node (``node2``) in another.
    ``hidden``: folders the second node cannot see (an empty tmpfs over each, in a mount namespace of its
    own, with a host name of its own: ``gkd-node2``), as on a machine of its own."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        cannot("network namespaces need root and iproute2 (`ip`); the multi-node test bed was not made")
    made = []
    try:
        for ns in NS.values():
            r = sh("ip", "netns", "add", ns, check=False)
            if r.returncode:
                cannot(f"cannot make a network namespace here: {r.stderr.strip()}")
            made.append(ns)
        veth = (f"gv{SUFFIX}a", f"gv{SUFFIX}b")
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for node, dev in zip(NS, veth, strict=True):
            sh("ip", "link", "set", dev, "netns", NS[node])
            sh("ip", "-n", NS[node], "addr", "add", f"{IP[node]}/24", "dev", dev)
            sh("ip", "-n", NS[node], "link", "set", dev, "up")
            sh("ip", "-n", NS[node], "link", "set", "lo", "up")
        env = dict(os.environ, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16),
                   RAY_ADDRESS=f"{IP['head']}:{GCS_PORT}")
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        common = ["--num-cpus", "2", "--disable-usage-stats"]
        sh(*in_ns("head", sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--node-ip-address",
                  IP["head"], "--port", str(GCS_PORT), "--include-dashboard=false", "--resources", '{"head": 1}',
                  *common,
                  "--temp-dir", f"/tmp/gkd-ns-{SUFFIX}"), timeout=120, env=env)
        start = [sys.executable, "-m", "ray.scripts.scripts", "start", "--address", f"{IP['head']}:{GCS_PORT}",
                 "--node-ip-address", IP["node2"], "--resources", '{"node2": 1}', *common]
        if hidden:
            for folder in hidden:
                os.makedirs(folder, mode=0o700, exist_ok=True)
            mounts = " && ".join(f"mount -t tmpfs -o mode=0700 gkd-hidden {shlex.quote(f)}" for f in hidden)
            start = ["unshare", "--mount", "--propagation", "private", "--uts", "sh", "-c",
                     f"{mounts} && hostname gkd-node2 && exec {shlex.join(start)}"]
        sh(*in_ns("node2", *start), timeout=120, env=env)
        yield env
    finally:
        stop_namespaces(made)  # this test's Ray nodes only: `ray stop` would stop every Ray on the machine
        for ns in made:
            sh("ip", "netns", "del", ns, check=False)
        shutil.rmtree(f"/tmp/gkd-ns-{SUFFIX}", ignore_errors=True)


@pytest.fixture
def two_nodes(gkd_home, monkeypatch):
    with cluster_of_two(monkeypatch) as env:
        yield env


def test_a_run_on_two_nodes_reports_from_both_and_refuses_strangers(two_nodes, gkd_home):
    run_dir = gkd_home / "runs" / "two-nodes"
    log = open(gkd_home / "run.log", "w")
    proc = subprocess.Popen(in_ns("head", sys.executable, "-m", "gkd_core", "run", "trainer.total_steps=100000",
                                  "trainer.checkpoint_every=1000",
                                  "trainer.placement={student: {head: 0.01}, rollout: {node2: 0.01}, "
                                  "teacher: {node2: 0.01}}",
                                  "--run-id", "two-nodes"), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    events = lambda: logged_events(run_dir)  # noqa: E731
    try:
        wait_until(lambda: (run_dir / "events.jsonl").exists() and
                   sum(e["kind"] == "metrics" for e in events()) >= 3, 180,
                   f"three steps on two nodes ({(gkd_home / 'run.log').read_text()[-600:]})")
        evs = events()
        pids = {e["src"]: e["pid"] for e in evs if e["kind"] == "worker"}
        where = {src: namespace_of(pid) for src, pid in pids.items()}
        assert where["student/0"] == NS["head"] and where["driver"] == NS["head"], where
        for src in ("rollout/0", "rollout/1", "teacher/0"):
            assert where[src] == NS["node2"], where
        # every worker's worker, phase and heartbeat events, from both nodes: a worker's heartbeats come
        # through its node's agent, batched (a `heartbeats` line holds the ones the log keeps)
        def kinds(src: str, evs: list[dict]) -> set[str]:
            beats = any(b[0] == src for e in evs if e["kind"] == "heartbeats" for b in e["beats"])
            return {e["kind"] for e in evs if e["src"] == src} | ({"heartbeat"} if beats else set())

        wait_until(lambda: all({"worker", "phase", "heartbeat"} <= kinds(src, events()) for src in pids), 15,
                   "worker, phase and heartbeat events of every worker")
        assert sum(src.startswith("agent/") for src in pids) == 2, pids  # an agent on each node
        via = {e["src"]: e.get("via", "") for e in evs if e["kind"] == "worker"}
        relays = {via[src] for src in ("rollout/0", "rollout/1", "teacher/0")}
        assert len(relays) == 1 and relays <= set(pids), via  # node 2's agent relays its workers' events
        assert via["student/0"] not in relays and via["student/0"].startswith("agent/"), via
        logs = [e["message"] for e in evs if e["kind"] == "log"]
        assert any(f"tcp://{IP['head']}:" in m and "CurveZMQ" in m for m in logs), logs
        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        remote = endpoints["ingest_tcp"]
        assert remote.startswith(f"tcp://{IP['head']}:")

        # stacks from both nodes, within 5 s
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "dump-stacks", "--run", str(run_dir), "--json"],
                             capture_output=True, text=True, timeout=30, cwd=ROOT)
        took = time.monotonic() - t0
        report = json.loads(out.stdout)
        got = {t for g in report["groups"] for t in g["targets"]}
        assert {"student/0", "rollout/0", "rollout/1", "teacher/0"} <= got, report
        assert took < 5, f"dump-stacks took {took:.1f} s"

        # strangers: no key, from the other namespace and from the head's own, over tcp
        forge = ("import sys, time; from gkd_core.telemetry.reporter import Reporter; "
                 "from gkd_core.telemetry import events as ev\n"
                 "with Reporter('stranger', ingest=sys.argv[1], run='two-nodes', heartbeat_s=60) as r:\n"
                 "    r.emit(ev.AlertEvent(severity='critical', code='forged', message='stop this run'))\n"
                 "    r.emit(ev.RunEvent(state='failed', reason='forged'))\n"
                 "    time.sleep(1.0)\n")
        for node in ("node2", "head"):
            sh(*in_ns(node, sys.executable, "-c", forge, remote), timeout=30)
        snap = json.loads(subprocess.run([sys.executable, "-m", "gkd_tui.cli", "status", str(run_dir), "--json"],
                                         capture_output=True, text=True, timeout=30, cwd=ROOT).stdout)
        assert "forged" not in json.dumps(snap), snap
        assert not [e for e in events() if e["src"] == "stranger" or e.get("reason") == "forged"]
        rejected = wait_until(lambda: [e for e in events() if e["kind"] == "alert"
                                       and e.get("code") == "ingest_rejected" and "unauthenticated" in e["message"]],
                              5, "the refused senders counted")
        assert rejected

        # a frozen worker on the second node is named, as on the head
        victim = pids["rollout/0"]
        os.kill(victim, signal.SIGSTOP)
        try:
            named = wait_until(lambda: [e for e in events() if e["kind"] == "alert" and not e.get("cleared")
                                        and "rollout/0" in e.get("targets", [])], 30, "an alert naming rollout/0")
        finally:
            os.kill(victim, signal.SIGCONT)
        assert named
    finally:
        stop(run_dir, proc, log)


def test_a_request_to_a_server_on_the_other_node_names_that_server_not_an_address_outside_the_job(gkd_home,
                                                                                                   monkeypatch):
    """A client actor on the head awaits a request to an inference server actor on the second node, at that
    node's address, whose handler stalls: the server is named (its request in flight, late), the client and the
    driver blocked by it; nobody is said to wait on an address outside the job (the server's flow says the
    address its requests came to)."""
    job = ROOT / "tests" / "jobs" / "ray_two_nodes_http.py"
    hidden = (str(gkd_home), str(Path(tempfile.gettempdir()) / f"gkd-{os.getuid()}"))  # a machine of its own
    with cluster_of_two(monkeypatch, hidden):
        run_dir = gkd_home / "runs" / "two-nodes-http"
        log = open(gkd_home / "run.log", "w")
        proc = subprocess.Popen(in_ns("head", sys.executable, "-m", "gkd_core", "run", "--run-id", "two-nodes-http",
                                      "--", sys.executable, str(job), "10"), cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            def stalled_at() -> float | None:
                driver_log = run_dir / "logs" / "driver.log"
                text = driver_log.read_text() if driver_log.exists() else ""
                return float(text.split("STALLED AT ")[1].split()[0]) if "STALLED AT " in text else None

            began = wait_until(stalled_at, 150, "the healthy requests to end", every_s=0.5)

            def named() -> list[dict]:
                return [a for a in logged_events(run_dir) if a["kind"] == "alert" and not a.get("cleared")
                        and a.get("severity") in ("warn", "critical") and a["ts"] >= began]

            first = wait_until(named, 60, "the stalled server named", every_s=0.5)[0]
            workers = {e["src"]: e for e in logged_events(run_dir) if e["kind"] == "worker"}
            assert workers["InferenceServer/0"]["node"] != workers["Client/0"]["node"], workers
            assert (first["code"], first["targets"]) == ("slower_than_usual", ["InferenceServer/0"]), first
            assert "POST /generate" in first["message"], first["message"]
            time.sleep(1.5)  # (a pass after the first: the blocked come with the chain)
            said = named()
            assert "external_wait" not in {a["code"] for a in said}, [(a["code"], a["message"]) for a in said]
            latest = [a for a in said if a["targets"] == ["InferenceServer/0"]][-1]
            assert "Client/0" in latest["evidence"].get("blocked", []), latest
        finally:
            stop(run_dir, proc, log)


def stop(run_dir, proc: subprocess.Popen, log) -> None:
    """`gkd-tui stop` the run, and its supervisor's end waited for."""
    subprocess.run([sys.executable, "-m", "gkd_tui.cli", "stop", str(run_dir)], capture_output=True, timeout=60,
                   cwd=ROOT)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


# The supervisor answers a dump once its own node's captures are done and the other nodes' stacks are in,
# or REMOTE_WAIT_S after the dump's start: by then every target has its stack or a note on record.
DUMP_ANSWERED_S = local_stacks.TIMEOUT_S + local_stacks.REMOTE_WAIT_S


def dump_answered(evs: list[dict], target: str, by: str = "", dump_id: str = "") -> dict | None:
    """The first dump of ``target`` (asked by ``by``, or the dump ``dump_id``) that the supervisor has
    answered: its ``action`` event."""
    def answer(e: dict) -> bool:
        result = e.get("result")
        return (e["kind"] == "action" and e.get("op") == "dump_stacks" and bool(e.get("ok"))
                and isinstance(result, dict) and target in result.get("targets", [])
                and e.get("by") == (by or e.get("by")) and result.get("dump_id") == (dump_id or result.get("dump_id")))
    return next((e for e in evs if answer(e)), None)


def stacks_before(evs: list[dict], answer: dict, target: str) -> list[dict]:
    """``target``'s stack events of the dump ``answer`` closes, recorded before that answer."""
    dump_id = answer["result"]["dump_id"]
    return [e for e in evs if e["kind"] == "stack" and e["dump_id"] == dump_id and e["target"] == target
            and e["seq"] < answer["seq"]]


def test_a_plain_ray_job_on_two_nodes_reports_from_the_other_node_under_launch(gkd_home, monkeypatch):
    """``launch -- COMMAND`` of a job that joins a running cluster of two nodes, the second a machine of
    its own as far as gkd can tell (it cannot see the run's folder nor its sockets, another host name):
    its actor there reports over the run's CurveZMQ tcp ingest, is named when it lags its peer on the
    head, and its stack, taken on its node, is one dump away."""
    job = ROOT / "tests" / "jobs" / "ray_two_nodes.py"
    stuck_line = next(i for i, line in enumerate(job.read_text().splitlines(), 1) if "the line its stack" in line)
    hidden = (str(gkd_home), str(Path(tempfile.gettempdir()) / f"gkd-{os.getuid()}"))  # the run; short sockets
    with cluster_of_two(monkeypatch, hidden):
        run_dir = gkd_home / "runs" / "two-nodes-job"
        log = open(gkd_home / "run.log", "w")
        proc = subprocess.Popen(in_ns("head", sys.executable, "-m", "gkd_core", "run", "--run-id", "two-nodes-job",
                                      "--", sys.executable, str(job)), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        def events() -> list[dict]:
            return logged_events(run_dir)

        try:
            def registered():
                if not (run_dir / "events.jsonl").exists():
                    return None
                ws = {e["src"]: e for e in events() if e["kind"] == "worker"}
                return ws if {"Worker/0", "Worker/1", "driver"} <= set(ws) else None

            ws = wait_until(registered, 120, f"both actors registered ({(gkd_home / 'run.log').read_text()[-600:]})",
                            every_s=0.5)
            assert ws["Worker/1"]["node"] == "gkd-node2" and ws["Worker/0"]["node"] == ws["driver"]["node"], ws
            remote = json.loads((run_dir / "endpoints.json").read_text())["ingest_tcp"]
            assert remote.startswith(f"tcp://{IP['head']}:"), remote

            def named():
                late = [a for a in events() if a["kind"] == "alert" and a.get("code") == "straggler"
                        and not a.get("cleared")]
                return late[-1] if late and late[-1]["targets"] == ["Worker/1"] else None

            alert = wait_until(named, 60, "Worker/1 named as the straggler", every_s=0.5)
            assert "work" in alert["message"], alert
            named_at = min(a["ts"] for a in events() if a["kind"] == "alert" and a.get("targets") == ["Worker/1"])

            # py-spy's `file:line`, or faulthandler's `file", line N` when two dumps' py-spy met on one pid
            shows = (f"ray_two_nodes.py:{stuck_line}", f'ray_two_nodes.py", line {stuck_line}')
            # the alert's own dump, the first on node 2: its stack there is in before the supervisor stops
            # waiting, taken by the helper the driver started with the job (not one it starts now)
            auto = wait_until(lambda: dump_answered(events(), "Worker/1", "diagnosis"), DUMP_ANSWERED_S,
                              "the alert's own dump of Worker/1 answered", every_s=0.5)
            print(f"the alert's own dump of Worker/1 on node 2 answered {auto['ts'] - named_at:.1f} s after "
                  "the alert")
            first = stacks_before(events(), auto, "Worker/1")
            assert first and {e["src"] for e in first} == {"driver"}, first
            assert any(s in first[-1]["text"] for s in shows), first
            t0 = time.monotonic()
            out = subprocess.run([sys.executable, "-m", "gkd_tui.cli", "dump-stacks", "--run", str(run_dir), "--json",
                                  "--timeout", f"{DUMP_ANSWERED_S:g}", "Worker/1"], capture_output=True, text=True,
                                 timeout=60, cwd=ROOT)
            took = time.monotonic() - t0
            dump = json.loads(out.stdout)
            assert out.returncode == 0, (out.stderr, dump, f"{took:.1f} s")
            print(f"the stack of Worker/1 on node 2 in {took:.1f} s")
            [group] = dump["groups"]
            assert any(s in group["stack"] for s in shows), group
            # ours on record as well (the CLI returned once the supervisor answered): taken by the driver's
            # helper on node 2, not by the supervisor
            answered = dump_answered(events(), "Worker/1", dump_id=dump["dump_id"])
            assert answered, f"no answer to {dump['dump_id']} on record though the CLI had one"
            ours = stacks_before(events(), answered, "Worker/1")
            assert ours and {e["src"] for e in ours} == {"driver"}, ours
            assert any(s in ours[-1]["text"] for s in shows), ours
            # the helper is the run's, not a worker of the job
            assert not [e["src"] for e in events() if e["kind"] == "worker" and "Stacks" in e["src"]]
        finally:
            stop(run_dir, proc, log)
