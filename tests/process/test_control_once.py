"""A control request acts once (issue #38): a client's retry carries the same id, and the supervisor
answers a repeat with the first answer without acting again, over real ZeroMQ sockets and a real
supervisor frozen while the request waits."""

from __future__ import annotations

import os
import signal
import threading
import time

import msgspec
import pytest
import zmq
from conftest import wait_until

from gkd_core.supervisor import control_ops
from gkd_core.telemetry import control
from gkd_core.telemetry.control import ControlClient, ControlError

pytestmark = pytest.mark.slow


class Asker(threading.Thread):
    """One request from a thread, as the dashboard sends it; its answer or its error kept."""

    def __init__(self, client: ControlClient, op: str, args: dict):
        super().__init__(name=f"ask-{op}", daemon=True)
        self.client, self.op, self.args = client, op, args
        self.answer = self.error = None

    def run(self) -> None:
        try:
            self.answer = self.client.request(self.op, self.args)
        except Exception as e:  # kept for the test to show
            self.error = e


def test_every_try_of_a_request_carries_the_same_id_and_bytes():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("inproc://control-once")
    per_try_s = 0.5
    client = ControlClient("inproc://control-once", ctx=ctx, timeout_s=per_try_s, retries=2)
    asker = Asker(client, "stop", {"grace_s": 5})
    asker.start()
    try:
        assert router.poll(int(per_try_s * 1000) * 4), "the first try never came"
        ident1, *_, first = router.recv_multipart()  # not answered: the client's deadline passes
        assert router.poll(int(per_try_s * 1000) * 4), "no second try after the first's deadline"
        ident2, *envelope, second = router.recv_multipart()
        assert ident2 != ident1  # the lazy pirate's fresh socket ...
        assert second == first  # ... with the very same request
        req_id = msgspec.json.decode(first)["id"]
        assert req_id != 0
        router.send_multipart([ident2, *envelope, control.encode_reply(True, {"stopping": True}, req_id=req_id)])
        asker.join(per_try_s * 4)
        assert not asker.is_alive()
        assert asker.error is None and asker.answer == {"stopping": True}
    finally:
        client.close()
        router.close(linger=0)
        ctx.term()


def test_serve_acts_once_on_a_repeated_id_and_records_one_action():
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.linger = 0
    router.bind("inproc://control-serve")
    calls: list[str] = []
    restarts = iter(range(1, 100))

    def restart(args, asked) -> dict:
        calls.append("restart")
        return {"restart": next(restarts)}

    def stop(args, asked) -> dict:
        calls.append("stop")
        raise control_ops.Refused("the run is stopping already")

    def ping(args, asked) -> dict:
        calls.append("ping")
        return {"pong": True}

    ops = {"restart": restart, "stop": stop, "ping": ping}
    actions: list = []
    recent = control_ops.RecentReplies()

    def ask(payload: dict) -> dict:
        """``payload`` from a fresh DEALER each time, as a retry comes; its answer decoded."""
        dealer = ctx.socket(zmq.DEALER)
        dealer.linger = 0
        dealer.connect("inproc://control-serve")
        try:
            dealer.send_multipart([b"", msgspec.json.encode(payload)])
            assert router.poll(2000), "the request did not reach the router"
            control_ops.serve(router, "ipc", ops, actions.append, recent)
            assert dealer.poll(2000), f"no answer to {payload}"
            return msgspec.json.decode(dealer.recv_multipart()[-1])
        finally:
            dealer.close(linger=0)

    try:
        first = ask({"op": "restart", "args": {}, "id": 41, "by": "alice"})
        assert ask({"op": "restart", "args": {}, "id": 41, "by": "alice"}) == first == {
            "ok": True, "error": "", "id": 41, "result": {"restart": 1}}
        assert calls == ["restart"] and [a.op for a in actions] == ["restart"]
        # a refusal is an answer too: the repeat gets it, and it is on the record once
        refused = ask({"op": "stop", "args": {}, "id": 42})
        assert ask({"op": "stop", "args": {}, "id": 42}) == refused and not refused["ok"]
        assert calls == ["restart", "stop"] and [(a.op, a.ok) for a in actions] == [("restart", True), ("stop", False)]
        # not repeats: another id, the same id with other arguments, an old client's request with no id
        assert ask({"op": "restart", "args": {}, "id": 43, "by": "alice"})["result"] == {"restart": 2}
        assert ask({"op": "restart", "args": {"shrink": True}, "id": 43, "by": "alice"})["result"] == {"restart": 3}
        assert ask({"op": "restart", "args": {}})["result"] == {"restart": 4}
        assert ask({"op": "restart", "args": {}})["result"] == {"restart": 5}
        # a query is answered afresh every time, and is no action
        ask({"op": "ping", "id": 44})
        ask({"op": "ping", "id": 44})
        assert calls.count("ping") == 2 and len(actions) == 6 and recent.repeats == 2
    finally:
        router.close(linger=0)
        ctx.term()


def test_a_restart_answered_late_restarts_once_and_its_asker_gets_that_restart(start_supervisor):
    """The supervisor frozen (SIGSTOP) while a restart waits on its socket, past the client's deadline for a
    try: the client sends it again; thawed, the supervisor restarts once and answers the retry with that
    restart, not with "a restart is already under way"."""
    sup = start_supervisor("trainer.total_steps=100000", step_s=0.05)
    first_driver = sup.wait_driver()
    per_try_s = 2.0
    with sup.client(timeout_s=per_try_s, retries=4) as c:
        # connected before the freeze, so the first try is in the frozen supervisor's socket, not in ours
        assert c.request("ping")["answer"] == "ping"
        os.kill(sup.proc.pid, signal.SIGSTOP)
        try:
            asker = Asker(c, "restart", {})
            asker.start()
            time.sleep(1.5 * per_try_s)  # the first try's deadline has passed: the client has sent it again
        finally:
            os.kill(sup.proc.pid, signal.SIGCONT)
        asker.join(per_try_s * (c.retries + 1))
        assert not asker.is_alive(), "the restart got no answer within the client's own deadlines"
        if isinstance(asker.error, ControlError):
            pytest.fail(f"the retry was refused instead of answered with the restart: {asker.error}")
        assert asker.error is None, asker.error
        assert asker.answer["restart"] == 1 and asker.answer["config"] == "restarts/001.yaml"
        # the first try reached the supervisor and a later one was answered from its memory
        assert c.request("snapshot")["supervisor"]["control_repeats"] >= 1

    def running_again():
        return [e for e in sup.events() if e["kind"] == "run" and e["state"] == "running" and e["restart"] == 1]
    wait_until(running_again, 20.0, "the driver running again as restart 1")
    # every try was in the supervisor's socket before the answer came back, seconds before the new driver
    # connected: each has been read by now, and the log says what each did
    assert sup.wait_driver() != first_driver
    sup_events = [e for e in sup.events() if e["src"] == "supervisor"]
    actions = [e for e in sup_events if e["kind"] == "action" and e["op"] == "restart"]
    assert [(a["ok"], a["result"]["restart"]) for a in actions] == [(True, 1)]
    asked = [e for e in sup_events if e["kind"] == "run" and e["state"] == "restarting"
             and e["reason"].startswith("restart requested by")]
    assert len(asked) == 1
    assert not [e for e in sup_events if e["kind"] == "run" and e.get("restart", 0) >= 2]
    assert not (sup.run / "restarts" / "002.yaml").exists()
