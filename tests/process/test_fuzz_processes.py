"""Hostile input, fuzzed, to real processes: the supervisor over its real control and ingest sockets,
the command line on a torn log. Fixed seeds (``derandomize``), a bounded number of examples."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import msgspec
import pytest
import zmq
from conftest import ROOT, wait_until
from fuzzing import (
    DAMAGED_ENDPOINTS,
    EXTREMES,
    LOG_LINES,
    RawDealer,
    alive,
    assert_log_intact,
    assert_refused,
    bad_messages,
    bad_requests,
    encode,
    event_objects,
    flushed,
    fuzz,
    torn_run,
)
from hypothesis import given

from gkd_core.telemetry import events as ev


@pytest.mark.parametrize("endpoints", DAMAGED_ENDPOINTS)
def test_status_and_bundle_of_a_dead_run_with_a_torn_log_say_so_without_a_traceback(endpoints, tmp_path, monkeypatch,
                                                                                    capsys):
    from gkd_tui import cli

    monkeypatch.setenv("GKD_HOME", str(tmp_path / "home"))
    lines = LOG_LINES[:60] + [b"\xff\xfe binary", b'{"kind":"phase","phase":42}', LOG_LINES[60][:30]]
    run = torn_run(tmp_path, lines, endpoints)
    assert cli.main(["status", str(run), "--timeout", "0.2"]) == 3
    err = capsys.readouterr().err
    assert "no run reachable" in err and str(run) in err and "replay" in err
    assert cli.main(["status", "--json", str(run), "--timeout", "0.2"]) == 3
    capsys.readouterr()
    out = tmp_path / "bundle.tar.gz"
    assert cli.main(["bundle", str(run), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    warning = [line for line in err.splitlines() if "skipped" in line]
    assert len(warning) == 1 and "skipped 3 line(s)" in warning[0] and "line 61" in warning[0], err
    with tarfile.open(out) as tar:
        names = {Path(n).name: n for n in tar.getnames()}
        assert tar.extractfile(names["events.jsonl"]).read() == b"\n".join(lines)  # the log as it is
        status = tar.extractfile(names["status.txt"]).read().decode()
    assert "no live state" in status and "from the event log (60 events" in status and "line 61" in status
    assert "hang-demo" in status  # the state the valid events lead to


@pytest.mark.slow
def test_the_command_line_on_a_torn_log_status_bundle_and_replay(tmp_path):
    """The real commands in their own processes: no traceback, the skipped lines said once."""
    lines = list(LOG_LINES) + [b"\x00\x01\x02", b'{"kind":"sync","sync_id":"x"}', b'{"v":1,"kind":"zzz","seq":1}',
                               LOG_LINES[5][:-3]]
    run = torn_run(tmp_path, lines, None)
    env = dict(os.environ, GKD_HOME=str(tmp_path / "home"),
               # the dashboard with no terminal: Textual's headless driver, End then q pressed for us
               TEXTUAL_DRIVER="textual.drivers.headless_driver:HeadlessDriver", TEXTUAL_PRESS="end,q")

    def gkd_tui(*args):
        r = subprocess.run([sys.executable, "-m", "gkd_tui.cli", *args], capture_output=True, text=True, timeout=60,
                           cwd=ROOT, env=env)
        assert "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
        return r

    r = gkd_tui("status", str(run), "--timeout", "0.2")
    assert r.returncode == 3 and "replay" in r.stderr
    r = gkd_tui("bundle", str(run), "-o", str(tmp_path / "b.tar.gz"))
    assert r.returncode == 0 and r.stdout.strip() == str(tmp_path / "b.tar.gz")
    assert f"skipped 3 line(s) that are not events: line {len(LOG_LINES) + 1}" in r.stderr
    r = gkd_tui("replay", str(run))
    assert r.returncode == 0, r.stderr
    note = [line for line in r.stderr.splitlines() if "skipped" in line]
    assert len(note) == 1 and f"line {len(LOG_LINES) + 1}" in note[0]
    assert f"other {len(LOG_LINES) + 1} events" in note[0]  # the unknown kind is an event, kept


@pytest.mark.slow
def test_control_refuses_hostile_requests_in_one_line_and_keeps_answering(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.2)
    sup.wait_driver()
    before = flushed(sup.run)
    raw = RawDealer(sup.endpoints["control"])
    raw.ping()

    @fuzz(150)
    @given(request=bad_requests())
    def one(request):
        body, words = request
        try:
            assert_refused(raw.ask(body), *words)
            raw.ping()  # and it still answers
        finally:
            alive(sup)

    one()
    # 10 MB: refused by its size, without reading it as JSON
    assert_refused(raw.ask(b'{"op": "ping", "args": {"x": "' + b"x" * (10 << 20) + b'"}}'), "larger than 64 KiB")
    raw.ping()
    # 1,000 requests at once, garbage and pings mixed, from one socket: every one answered within 10 s
    t0 = time.monotonic()
    for i in range(1000):
        raw.sock.send_multipart([b"", encode({"op": "ping", "id": 10_000 + i}) if i % 2 else b"\x00garbage %d" % i])
    answers = []
    while len(answers) < 1000 and raw.sock.poll(max(1, int((t0 + 10 - time.monotonic()) * 1000))):
        answers.append(msgspec.json.decode(raw.sock.recv_multipart()[-1]))
    assert len(answers) == 1000, f"{len(answers)} answers in 10 s"
    assert sorted(a["id"] for a in answers if a["ok"]) == [10_000 + i for i in range(1, 1000, 2)]
    assert sum(not a["ok"] and "malformed" in a["error"] for a in answers) == 500
    raw.ping()
    raw.close()
    with sup.client() as c:  # another client, the ordinary way: the run goes on as it was
        snap = c.request("snapshot")
    assert snap["state"]["state"] == "running" and snap["supervisor"]["driver_connected"]
    assert sup.proc.poll() is None
    time.sleep(0.2)  # the refusals flushed to the log (every 100 ms at most)
    events = assert_log_intact(sup.run, before)
    runs = [e["state"] for e in events if e["kind"] == "run"]
    assert runs == ["starting", "running"]  # neither stopped nor restarted by any of it
    refused = [e for e in events if e["kind"] == "action" and not e["ok"]]
    assert len(refused) >= 150 + 1 + 500  # every refusal on the record


@pytest.mark.slow
def test_ingest_drops_and_counts_hostile_messages_and_keeps_the_log_clean(start_supervisor):
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.2)
    sup.wait_driver()
    before = flushed(sup.run)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.linger = 5000
    push.connect(sup.endpoints["ingest"])
    for obj in EXTREMES[1:]:  # the ones that broke a pane once (the run event aside: see below)
        push.send_multipart([obj["kind"].encode(), encode(obj)])
    sent_bad = []

    @fuzz(150)  # (no `run` events: the run's own state is the supervisor's word, asserted below)
    @given(bad=bad_messages(), odd=event_objects(hostile=False, kinds=tuple(k for k in ev.KINDS if k != "run")))
    def one(bad, odd):
        push.send_multipart(bad)
        sent_bad.append(bad)
        # beside them, odd events that are valid: a rank of "²", extreme numbers, unknown kinds and fields
        push.send_multipart([odd["kind"].encode(), encode(odd)])

    one()
    push.send_multipart([b"log", encode({"v": 1, "kind": "log", "src": "fuzz/end", "message": "the end"})])
    push.close()

    def ended():
        alive(sup)
        return any(e.get("src") == "fuzz/end" for e in assert_log_intact(sup.run, before))
    wait_until(ended, 20.0, "the last message in the log")
    with sup.client() as c:
        snap = c.request("snapshot")
        assert c.request("ping")["answer"] == "ping"
    assert sum(snap["supervisor"]["rejected"].values()) == len(sent_bad), snap["supervisor"]["rejected"]
    assert set(snap["supervisor"]["rejected"]) <= {"garbage", "malformed", "oversized", "version"}
    assert snap["state"]["state"] == "running" and sup.proc.poll() is None
    events = assert_log_intact(sup.run, before)  # every line an event
    assert not [e for e in events if e.get("src") == "fuzz/bad" or e.get("message") == "must not be logged"]
    wait_until(lambda: any(e["kind"] == "alert" and e.get("code") == "ingest_rejected"
                           for e in assert_log_intact(sup.run, before)), 5.0, "an ingest_rejected alert")
