"""A pipeline's waits through data, on a RunState built from the events a watched Ray job sends: a call parked
on a queue or a gate waits on whoever sends the calls that set it (their ``sends``); a cycle through a parked
producer names the producer, with the queue and the trainer blocked by it; a chain of waits that ends in a
request to a server outside the job names the worker at its end; and a process's sends are read off its
book of calls, said again only when they change."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.diagnosis.holds import what_holds
from gkd_core.diagnosis.rules import servers
from gkd_core.diagnosis.rules.waits import Edge, wait_graph
from gkd_core.integrations.waits import RefBook, Sends
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.vocab import DataWait, HttpWait

T0 = 1000.0
GATE = ("run: waiting on an asyncio.Condition in run (pipeline.py:88; its numbers: produced=12, param_version=4), "
        "set by update_param_version, last 1.0 s before this wait")
TOOL = HttpWait("POST", "127.0.0.1:9000", "/run", 4242)


def pipeline() -> RunState:
    """A driver, two trainer ranks, a message queue and a rollouter, each having said whom it sends calls to."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for pid, src in enumerate(("driver", "Trainer/0", "Trainer/1", "MessageQueue/0", "Rollouter/0"), 100):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=0, node="node-a", pid=pid, ts=T0 - 50))
    st.apply(ev.SendsEvent(src="Rollouter/0", to=["MessageQueue/0.put_sample"], ts=T0 - 40))
    st.apply(ev.SendsEvent(src="Trainer/0", to=["MessageQueue/0.get_sample", "Rollouter/0.update_param_version"],
                           ts=T0 - 40))
    st.apply(ev.SendsEvent(src="Trainer/1", to=["MessageQueue/0.get_sample"], ts=T0 - 40))
    return st


def phase(st, src, name, ts, waits_on=(), detail="", call=None):
    st.apply(ev.PhaseEvent(src=src, phase=name, started=ts, waits_on=list(waits_on), ts=ts, detail=detail, call=call))


def starved(st: RunState) -> None:
    """The trainer stopped sending the new version: the rollouter parks at its gate, the queue runs dry, both
    ranks wait on it, the driver on the ranks."""
    phase(st, "driver", "ray.get", T0 - 30, waits_on=["Trainer/0.train", "Trainer/1.train"])
    phase(st, "Rollouter/0", "run", T0 - 30, call=1, waits_on=[DataWait(("update_param_version",)).said()],
          detail=GATE)
    phase(st, "MessageQueue/0", "get_sample", T0, call=40, waits_on=[DataWait(("put_sample",)).said()])
    for rank in (0, 1):
        phase(st, f"Trainer/{rank}", "train", T0 - 30, call=1, waits_on=["MessageQueue/0.get_sample"])


def test_a_wait_on_data_is_said_and_read_back_and_nothing_else_is_one():
    assert DataWait.parse(DataWait(("put_sample", "requeue")).said()) == DataWait(("put_sample", "requeue"))
    assert DataWait.parse("data") == DataWait(()) and DataWait(()).said() == "data"
    assert DataWait.parse("MessageQueue/0.get_sample") is None and DataWait.parse("database.get") is None


def test_a_wait_on_data_is_an_edge_to_each_worker_that_sends_the_calls_that_set_it():
    st = pipeline()
    starved(st)
    graph = wait_graph(st)
    assert graph["MessageQueue/0"] == [Edge("Rollouter/0", "put_sample", T0, data=True)]
    assert graph["Rollouter/0"] == [Edge("Trainer/0", "update_param_version", T0 - 30, data=True)]
    assert [e.target for e in graph["Trainer/1"]] == ["MessageQueue/0"]
    # a worker that sends nothing the wait's methods name is no edge; nor a wait set by no call at all
    phase(st, "MessageQueue/0", "get_sample", T0 + 1, call=41, waits_on=[DataWait(()).said()])
    assert "MessageQueue/0" not in wait_graph(st)


def test_a_cycle_through_a_parked_producer_names_the_producer_at_its_gate_and_blocks_the_queue_and_the_trainer():
    st = pipeline()
    starved(st)
    assert [a.code for a in diagnosis.diagnose(st, T0 + 4) if a.severity != "info"] == []  # not still long enough
    alerts = [a for a in diagnosis.diagnose(st, T0 + 6) if a.severity != "info"]
    assert [(a.code, a.severity, a.targets) for a in alerts] == [("producer_parked", "critical", ["Rollouter/0"])]
    parked = alerts[0]
    assert "produced=12, param_version=4" in parked.message  # the version it waits for, as its gate holds it
    assert "only Trainer/0's calls of update_param_version open it" in parked.message, parked.message
    assert parked.evidence["blocked"] == ["MessageQueue/0", "Trainer/0", "Trainer/1", "driver"]
    assert parked.evidence["gate"] == "Trainer/0 sending update_param_version"
    for a in alerts:
        st.apply(a)
    assert st.workers["Trainer/0"].blocked_by == "Rollouter/0"
    assert what_holds(st, T0 + 6).startswith("a queue starved by a parked producer: Rollouter/0 waits for Trainer/0 "
                                             "sending update_param_version")
    # the trainer sends the version again: the gate opens, the cycle moves, nothing is named
    phase(st, "Rollouter/0", "run", T0 + 7, call=1)
    assert [a.code for a in diagnosis.diagnose(st, T0 + 8) if a.severity != "info"] == []


def test_a_gate_call_parked_beside_the_call_its_consumer_waits_on_is_a_parked_producer_not_a_deadlock():
    """slime's shape with a producer task: one threaded actor holds the queue and the gate; the task's call of
    its gate is parked (the shown call), while the trainer waits on another call of it, the queue's get: the
    two-member cycle is the parked producer, named (it read as a deadlock of the trainer and the actor)."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for pid, src in enumerate(("driver", "Trainer/0", "RolloutManager/0", "produce/0"), 100):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=0, node="node-a", pid=pid, ts=T0 - 50))
    st.apply(ev.SendsEvent(src="produce/0", to=["RolloutManager/0.pass_gate", "RolloutManager/0.put_sample"],
                           ts=T0 - 40))
    st.apply(ev.SendsEvent(src="Trainer/0", to=["RolloutManager/0.get_sample",
                                                "RolloutManager/0.update_param_version"], ts=T0 - 40))
    phase(st, "driver", "ray.get", T0 - 30, waits_on=["Trainer/0.train"])
    phase(st, "produce/0", "produce", T0 - 30, call=1, waits_on=["RolloutManager/0.pass_gate"])
    phase(st, "RolloutManager/0", "pass_gate", T0 - 30, call=9, waits_on=[DataWait(("update_param_version",)).said()],
          detail=GATE.replace("run: ", "").replace(" in run ", " in pass_gate "))
    phase(st, "Trainer/0", "train", T0 - 30, call=1, waits_on=["RolloutManager/0.get_sample"])
    alerts = [a for a in diagnosis.diagnose(st, T0 + 6) if a.severity != "info"]
    assert [(a.code, a.targets) for a in alerts] == [("producer_parked", ["RolloutManager/0"])], alerts
    assert ("only Trainer/0's calls of update_param_version open it, and Trainer/0 waits on "
            "RolloutManager/0.get_sample, another call of RolloutManager/0's, beside the parked one") \
        in alerts[0].message, alerts[0].message
    assert {"Trainer/0", "driver", "produce/0"} <= set(alerts[0].evidence["blocked"])


def test_a_chain_that_ends_in_a_request_to_a_server_outside_the_job_names_the_worker_at_its_end():
    """The queue is late (its history says 0.3 s), waiting on the rollouter, which waits on a tool outside
    the job: the rollouter is named, with the tool's address and process, and the rest are blocked by it."""
    st = pipeline()
    phase(st, "driver", "ray.get", T0 - 30, waits_on=["Trainer/0.train", "Trainer/1.train"])
    phase(st, "Rollouter/0", "run", T0 - 30, call=1)
    for i in range(6):  # the queue's healthy history
        phase(st, "MessageQueue/0", "get_sample", T0 - 20 + i, call=i + 1, waits_on=[DataWait(("put_sample",)).said()])
        phase(st, "MessageQueue/0", "idle", T0 - 20 + i + 0.3)
    phase(st, "Trainer/0", "train", T0 - 30, call=1, waits_on=["MessageQueue/0.get_sample"])
    phase(st, "MessageQueue/0", "get_sample", T0, call=7, waits_on=[DataWait(("put_sample",)).said()])
    phase(st, "Rollouter/0", "run", T0 - 30, call=1, waits_on=[TOOL.said()],
          detail="run: waiting for POST /run on 127.0.0.1:9000 (pid 4242: python tool_server.py)")
    st.workers["Rollouter/0"].waits_since = T0  # (the request began with the stall)
    alerts = [a for a in diagnosis.diagnose(st, T0 + 8) if a.severity != "info"]
    assert [(a.code, a.targets) for a in alerts] == [("external_wait", ["Rollouter/0"])], alerts
    said = alerts[0]
    assert said.message.startswith("Rollouter/0 has waited 8 s for POST /run on 127.0.0.1:9000 (pid 4242: python "
                                   "tool_server.py), a server outside the job"), said.message
    assert said.evidence["found_as"] == ["slower_than_usual"] and said.evidence["external"] == TOOL.route()
    assert said.evidence["blocked"] == ["MessageQueue/0", "Trainer/0", "driver"]


def test_a_request_to_a_server_on_another_node_is_a_wait_on_that_worker_by_the_address_it_serves():
    """The rollouter on node-a waits on a server on node-b (its request's pid 0: nobody listens there on node-a);
    the server's flow says the addresses its requests came to. The request is an edge to that worker, not an
    address outside the job, and the pipeline has no outside address; a loopback address is each node's own,
    never another's."""
    from gkd_core.state.pipeline import pipeline_view

    st = pipeline()
    st.apply(ev.WorkerEvent(src="InferenceServer/0", role="InferenceServer", rank=0, node="node-b", pid=300,
                            ts=T0 - 50))
    st.apply(ev.FlowEvent(src="InferenceServer/0", ts=T0 - 5, calls={"POST /generate": 40},
                          serves=["10.0.0.2:8000", "127.0.0.1:8000"]))
    phase(st, "InferenceServer/0", "POST /generate", T0 - 10, call=41)
    remote = HttpWait("POST", "10.0.0.2:8000", "/generate", 0)
    phase(st, "Rollouter/0", "run", T0 - 10, call=1, waits_on=[remote.said()],
          detail="run: waiting for POST /generate on 10.0.0.2:8000 (not served on this node)")
    assert wait_graph(st)["Rollouter/0"] == [Edge("InferenceServer/0", remote.route(), T0 - 10, request=True)]
    assert servers.external_request(st, st.workers["Rollouter/0"]) is None
    assert pipeline_view(st, T0).peers == []
    local = HttpWait("POST", "127.0.0.1:8000", "/generate", 0)  # node-a's own port 8000, where nobody listens
    phase(st, "Rollouter/0", "run", T0 - 10, call=1, waits_on=[local.said()])
    assert "Rollouter/0" not in wait_graph(st) and servers.external_request(st, st.workers["Rollouter/0"]) == local
    assert [p.address for p in pipeline_view(st, T0).peers] == ["127.0.0.1:8000"]


def test_a_process_says_whom_it_sends_calls_to_from_its_book_and_again_only_when_that_changes():
    names = {"aa" * 16: "MessageQueue/0", "bb" * 16: "Rollouter/0"}
    book = RefBook(names.get)
    sends = Sends(book)

    def ref(actor: str, n: int) -> bytes:  # an actor call's ref: its task id (8 bytes, the actor's 16) and an index
        return n.to_bytes(8, "big") + bytes.fromhex(actor) + (1).to_bytes(4, "little")

    for n in range(100):
        book.newer[ref("aa" * 16, n)] = "put_sample"
    assert sends.now() == ["MessageQueue/0.put_sample"]
    book.newer[ref("aa" * 16, 100)] = "put_sample"
    assert sends.now() is None  # nothing new to say
    book.newer[ref("bb" * 16, 101)] = "update_param_version"
    book.sent("Trainer/1", "step", None)  # (a call its sender named itself: nothing kept without a ref)
    book.newer[b"r" * 28] = ("Learner/3", "train")
    assert sends.now() == ["Learner/3.train", "MessageQueue/0.put_sample", "Rollouter/0.update_param_version"]


def test_a_call_waiting_on_data_that_only_a_dead_thread_fed_names_the_worker_with_the_threads_error():
    st = pipeline()
    st.apply(ev.WorkerEvent(src="RolloutBuffer/0", role="RolloutBuffer", rank=0, node="node-a", pid=200, ts=T0 - 50))
    live = DataWait((DataWait.of_thread("rollout-producer", alive=True),)).said()
    phase(st, "RolloutBuffer/0", "get_batch", T0, call=9, waits_on=[live],
          detail="get_batch: waiting on a queue.Queue in get_batch (job.py:35), set by its thread rollout-producer")
    assert [a.code for a in diagnosis.diagnose(st, T0 + 30) if a.severity != "info"] == []  # alive: only waits
    dead = DataWait((DataWait.of_thread("rollout-producer", alive=False),)).said()
    phase(st, "RolloutBuffer/0", "get_batch", T0, call=9, waits_on=[dead],
          detail="get_batch: waiting on a queue.Queue in get_batch (job.py:35), set only by its thread "
                 "rollout-producer, which ended with ValueError: sample 51 has no reward")
    (a,) = [a for a in diagnosis.diagnose(st, T0 + 31) if a.severity != "info"]
    assert (a.code, a.severity, a.targets) == ("producer_died", "critical", ["RolloutBuffer/0"])
    assert a.message.startswith("RolloutBuffer/0.get_batch waits on data that only its thread rollout-producer fed, "
                                "which has ended with ValueError: sample 51 has no reward"), a.message
