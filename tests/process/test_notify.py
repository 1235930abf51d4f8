"""gkd_core/notify: a real webhook receiver on 127.0.0.1 gets one POST per new critical alert and one for its
clearing, none again within the quiet period; a receiver that is down is tried again and the failure said,
never its URL's secret; a command gets the same JSON on stdin."""

from __future__ import annotations

import json
import socket
import sys
import time

import pytest

from gkd_core.notify import TRIES, Notifier, Outcome, redacted
from gkd_core.telemetry.events import AlertEvent

SECRET = "/services/T000/B000/XXXXsecretXXXX"


@pytest.fixture
def receiver(webhook):
    base, got = webhook
    return f"{base.replace('http://', 'http://hook:pw@')}{SECRET}?token=abc", got


def stalled(severity="critical", cleared=False, message="rollout/1 has been in sync_weights for 12 s") -> AlertEvent:
    return AlertEvent(severity=severity, code="straggler", targets=["rollout/1"], message=message,
                      hint="its stack (d)", cleared=cleared, ts=1.0)


def until(pred, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def test_a_critical_alert_is_posted_once_its_repeats_are_not_and_its_clearing_is(receiver):
    url, got = receiver
    outcomes: list[Outcome] = []
    n = Notifier([url], [], "run-1", "gkd-tui attach run-1", outcomes.append)
    n.alert(stalled(severity="warn"))  # not critical: not said
    n.alert(stalled())
    n.alert(stalled(message="rollout/1 has been in sync_weights for 18 s"))  # the same alert, grown: not again
    assert until(lambda: len(outcomes) == 1)
    n.alert(stalled(cleared=True))
    assert until(lambda: len(outcomes) == 2)
    n.close()
    assert [p.body["kind"] for p in got] == ["alert", "cleared"]
    first = got[0].body
    assert first["text"] == ("gkd run run-1: CRITICAL straggler on rollout/1: rollout/1 has been in sync_weights for "
                             "12 s (gkd-tui attach run-1)")
    assert (first["code"], first["targets"], first["severity"], first["run"], first["attach"]) == (
        "straggler", ["rollout/1"], "critical", "run-1", "gkd-tui attach run-1")
    assert got[0].authorization == "Basic aG9vazpwdw=="  # its user part, as basic auth (hook:pw)
    assert all(o.ok and o.tries == 1 for o in outcomes)
    assert SECRET not in repr(outcomes) and "token" not in repr(outcomes) and "pw" not in repr(outcomes)
    assert outcomes[0].to == f"http://127.0.0.1:{url.split(':')[3].split('/')[0]}/…"


def test_an_alert_still_there_a_quiet_period_later_is_said_again(receiver):
    url, got = receiver
    outcomes: list[Outcome] = []
    n = Notifier([url], [], "run-1", "gkd-tui attach run-1", outcomes.append, quiet_s=0.2)
    n.alert(stalled())
    n.alert(stalled())
    time.sleep(0.3)
    n.alert(stalled())
    n.close()
    assert len(got) == 2


def test_a_receiver_that_is_down_is_tried_again_and_its_failure_said_without_the_secret():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    outcomes: list[Outcome] = []
    n = Notifier([f"http://user:pw@127.0.0.1:{port}{SECRET}"], [], "run-1", "gkd-tui attach run-1",
                 outcomes.append, backoff_s=0.01)
    began = time.monotonic()
    n.alert(stalled())  # (returns at once: the sending is the notifier's thread's)
    assert time.monotonic() - began < 0.1
    assert until(lambda: outcomes)
    n.close()
    (o,) = outcomes
    assert (o.ok, o.tries, o.to) == (False, TRIES, f"http://127.0.0.1:{port}/…") and "refused" in o.error.lower()
    assert SECRET not in repr(o) and "pw" not in repr(o)


def test_a_command_gets_the_same_json_on_its_stdin_and_its_failure_is_said(tmp_path):
    out = tmp_path / "said.json"
    outcomes: list[Outcome] = []
    saving = f"{sys.executable} -c 'import sys; open(\"{out}\", \"w\").write(sys.stdin.read())'"
    n = Notifier([], [saving, "exit 3"], "run-1", "gkd-tui attach run-1", outcomes.append, backoff_s=0.01)
    n.alert(stalled())
    assert until(lambda: len(outcomes) == 2)
    n.close()
    said = json.loads(out.read_text())
    assert (said["code"], said["targets"], said["kind"]) == ("straggler", ["rollout/1"], "alert")
    assert [(o.to, o.ok) for o in outcomes] == [("command", True), ("command", False)]
    assert outcomes[1].error.startswith("ValueError: exit 3")


def test_a_url_is_said_by_its_scheme_and_host_alone():
    assert redacted("https://hooks.slack.com/services/T0/B0/secret") == "https://hooks.slack.com/…"
    assert redacted("http://u:p@127.0.0.1:8080/hook?key=1") == "http://127.0.0.1:8080/…"
