"""A run nobody watches (#56), end to end with a real supervisor: its driver frozen (SIGSTOP) is a critical
alert posted to a local webhook within 10 s, with its code, targets, message and the command that attaches,
and its clearing once the driver is thawed; a receiver that is down is tried again, the run unaffected and
the failure on the record; /metrics scraped during the hang says the frozen worker's seconds growing and its
alert, on the loopback only."""

from __future__ import annotations

import os
import signal
import socket
import time
import urllib.request

import pytest
from conftest import wait_until
from prometheus_client.parser import text_string_to_metric_families

from gkd_core import rundir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(address: str) -> dict:
    with urllib.request.urlopen(address, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.mark.timeout(120)
def test_a_frozen_driver_is_posted_cleared_and_scraped_and_a_dead_receiver_is_on_the_record(start_supervisor,
                                                                                            webhook):
    base, got = webhook
    url = f"{base}/hooks/T0/B0/secret-token"
    down = f"http://127.0.0.1:{free_port()}/hook/down-secret"
    sup = start_supervisor("trainer.total_steps=100000", "--notify", url, "--notify", down, "--metrics-port",
                           str(free_port()), step_s=0.05)
    pid = sup.wait_driver()
    metrics = rundir.read_endpoints(sup.run)["metrics"]
    assert metrics.startswith("http://127.0.0.1:")
    time.sleep(2.0)  # a few steps: the driver's usual beat
    os.kill(pid, signal.SIGSTOP)
    try:
        frozen = wait_until(lambda: [e for e in sup.events() if e["kind"] == "alert" and not e.get("cleared")
                                     and e["severity"] == "critical" and "driver" in e["targets"]], 30,
                            "the frozen driver named")[0]
        posted = wait_until(lambda: [p.body for p in got if p.body["kind"] == "alert"], 15, "the alert posted")
        when = next(p.ts for p in got if p.body["kind"] == "alert")
        assert when - frozen["ts"] <= 10, when - frozen["ts"]
        m = posted[0]
        assert (m["code"], m["severity"], m["targets"]) == (frozen["code"], "critical", frozen["targets"])
        assert m["message"] and m["attach"] == f"gkd-tui attach {sup.run}" and m["run"] == sup.run.name
        assert m["text"].startswith(f"gkd run {sup.run.name}: CRITICAL {frozen['code']} on driver")
        first = scrape(metrics)
        time.sleep(2.0)
        second = scrape(metrics)

        def phase_seconds(samples):
            return next(v for (name, labels), v in samples.items()
                        if name == "gkd_worker_phase_seconds" and ("worker", "driver") in labels)

        assert phase_seconds(second) >= phase_seconds(first) + 1.5
        assert any(name == "gkd_alert_active" and ("target", "driver") in labels and ("code", frozen["code"]) in labels
                   for name, labels in second)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: [p for p in got if p.body["kind"] == "cleared"], 30, "the clearing posted")
    assert [p.body["kind"] for p in got].count("alert") == 1  # once, however its message grew
    outcomes = wait_until(lambda: [e for e in sup.events() if e["kind"] == "action" and e["op"] == "notify"
                                   and not e["ok"]], 30, "the dead receiver's failure on the record")
    assert outcomes[0]["result"]["tries"] == 3 and outcomes[0]["result"]["to"] == f"{down.rsplit('/hook', 1)[0]}/…"
    log = (sup.run / "events.jsonl").read_text()
    assert "secret-token" not in log and "down-secret" not in log  # the URLs' secrets are on no record
    assert sup.client().request("ping")["answer"] == "ping"  # the run went on
