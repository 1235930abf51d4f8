"""integrations/http_calls: what a request in flight is said as: its route (ids and keys not kept), the
process serving it by program and script (never an argument), and no listener read twice within its keep."""

from __future__ import annotations

import os

from gkd_core.integrations import http_calls
from gkd_core.vocab import HttpWait


def test_a_path_is_said_as_a_route_its_ids_and_keys_left_out():
    assert http_calls._shape("/v1/chat/completions") == "/v1/chat/completions"
    assert http_calls._shape("/items/123/runs/0b7c7b2e-55d1-4d0e-9c55-1f0e3c3b9d2a") == "/items/{id}/runs/{id}"
    assert http_calls._shape("/bot123456:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage") == "/{id}/sendMessage"
    assert http_calls._shape("/x" * 100).endswith("…") and len(http_calls._shape("/x" * 100)) == 121
    said = HttpWait("POST", "127.0.0.1:80", http_calls._shape("/items/42"), 0).said()
    assert HttpWait.parse(said) == HttpWait("POST", "127.0.0.1:80", "/items/{id}", 0)


def test_the_process_serving_an_address_is_said_by_program_and_script_never_an_argument():
    said = http_calls._command(os.getpid())  # this test's own process: python -m pytest ... (arguments left out)
    assert said.startswith("python") and "-q" not in said and "tests/" not in said, said
    assert http_calls._command(2**22 + 12345) == ""  # no such process


def test_a_listener_table_is_read_once_within_its_keep_misses_included(monkeypatch):
    reads = []
    monkeypatch.setattr(http_calls, "_listening", lambda: reads.append(1) or {8000: 4242})
    peers = http_calls.Listeners()
    assert peers.pid_of("127.0.0.1", 8000) == 4242
    assert peers.pid_of("127.0.0.1", 9999) == 0  # nobody listens: not read again for it
    assert peers.pid_of("localhost", 8000) == 4242 and len(reads) == 1
    assert peers.pid_of("10.255.255.1", 8000) == 0 and len(reads) == 1  # not this node's address: not looked up

