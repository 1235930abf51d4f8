"""The wait-for graph (gkd_core/diagnosis/rules/waits.py) on a RunState built from the phase events a watched
Ray job sends: a cycle of waits that has stopped is one deadlock naming every member, edge and the worker
blocked behind it; a cycle that moves, or a chain that ends in a worker at work, is none."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.diagnosis.holds import what_holds
from gkd_core.diagnosis.rules.servers import external_request
from gkd_core.diagnosis.rules.waits import Edge, cycles, wait_graph
from gkd_core.integrations.waits import RefBook, Wait
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.vocab import HttpWait

T0 = 1000.0


def job() -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role in (("driver", "driver"), ("Trainer/0", "Trainer"), ("Inference/0", "Inference")):
        st.apply(ev.WorkerEvent(src=src, role=role, rank=0, node="node-a", pid=100, ts=T0 - 50))
    return st


def phase(st, src, name, ts, call=None, waits_on=()):
    st.apply(ev.PhaseEvent(src=src, phase=name, started=ts, call=call, waits_on=list(waits_on), ts=ts,
                           detail=f"ray.get: waiting for {', '.join(waits_on)}" if waits_on else ""))


def deadlocked() -> RunState:
    """Trainer/0.step waits on Inference/0.generate, which waits on Trainer/0.weights_ready, queued behind the
    running step; the driver waits on Trainer/0.step."""
    st = job()
    phase(st, "driver", "ray.get", T0, waits_on=["Trainer/0.step"])
    phase(st, "Trainer/0", "step", T0 + 0.1, call=3, waits_on=["Inference/0.generate"])
    phase(st, "Inference/0", "generate", T0 + 0.2, call=3, waits_on=["Trainer/0.weights_ready"])
    return st


def gloo_pair() -> RunState:
    """Learner/0 (rank 0) and Rollout/0 (rank 1) of one gloo group, read from the Flight Recorder."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role in (("Learner/0", "Learner"), ("Rollout/0", "Rollout")):
        st.apply(ev.WorkerEvent(src=src, role=role, rank=0, node="node-a", pid=100, ts=T0 - 50))
    return st


def entered(st, src, rank, n, ts):
    """``src`` entered broadcast #n of the group; gloo's recorder never says it left (``left`` None)."""
    st.apply(ev.CollectivesEvent(src=src, ts=ts, groups=[ev.CollectiveProgress(
        group="default_pg", rank=rank, world=2, entered=n, op="broadcast", entered_at=ts, left=None,
        source="flight_recorder")]))


def deadlocks(st, now):
    return [a for a in diagnosis.diagnose(st, now) if a.code == "deadlock"]


def test_a_cycle_of_two_actors_is_one_deadlock_naming_each_edge_and_the_driver_behind_it():
    st = deadlocked()
    assert deadlocks(st, T0 + 5.1) == []  # not yet still for the straggler threshold
    (a,) = deadlocks(st, T0 + 5.3)
    assert a.severity == "critical" and sorted(a.targets) == ["Inference/0", "Trainer/0"]
    assert a.message.startswith("deadlock: Trainer/0.step #3 waits for Inference/0.generate #3, which waits for "
                                "Trainer/0.weights_ready, queued behind Trainer/0.step #3; none of the 2 has moved")
    assert a.evidence["cycle"] == [["Trainer/0", "Inference/0.generate"], ["Inference/0", "Trainer/0.weights_ready"]]
    assert a.evidence["blocked"] == ["driver"]
    # the victim at the end of the chain is no finding of its own: nothing blames the driver
    assert not [x for x in diagnosis.diagnose(st, T0 + 30) if "driver" in x.targets]


def test_an_actor_waiting_on_its_own_method_is_a_cycle_of_one():
    st = job()
    phase(st, "Trainer/0", "step", T0, call=1, waits_on=["Trainer/0.weights_ready"])
    (a,) = deadlocks(st, T0 + 6)
    assert a.targets == ["Trainer/0"]
    assert "Trainer/0.step #1 waits for Trainer/0.weights_ready, queued behind Trainer/0.step #1" in a.message


def test_a_cycle_that_moves_is_no_deadlock():
    st = deadlocked()
    # Inference/0's wait is answered and it waits anew each 2 s (a call of its own that returns): it moved
    for t in (2.0, 4.0, 6.0, 8.0):
        phase(st, "Inference/0", "generate", T0 + t, call=3 + int(t), waits_on=["Trainer/0.weights_ready"])
    assert deadlocks(st, T0 + 9) == []
    assert len(deadlocks(st, T0 + 8 + 5.5)) == 1  # and once it stops, it is one


def test_a_chain_that_ends_in_a_worker_at_work_is_no_cycle():
    st = job()
    phase(st, "driver", "ray.get", T0, waits_on=["Trainer/0.step"])
    phase(st, "Trainer/0", "step", T0, call=1, waits_on=["Inference/0.generate"])
    phase(st, "Inference/0", "generate", T0, call=1)
    assert deadlocks(st, T0 + 60) == []


def test_the_search_finds_each_knot_once_in_a_graph_of_many_and_stays_linear():
    def to(*targets):
        return [Edge(t, "m", 0.0) for t in targets]

    graph = {"a": to("b"), "b": to("c", "a"), "c": to("a"), "d": to("d"), "e": to("a")}
    found = cycles(graph)
    # a, b and c are one knot (two cycles through a and b): one deadlock, said once; d waits on itself
    assert sorted(sorted(w for w, _ in c) for c in found) == [["a", "b", "c"], ["d"]]
    assert len(cycles(graph, limit=1)) == 1
    # a chain of 100,000 waiters into one cycle: one pass, no recursion
    big = {f"w{i}": to(f"w{i + 1}") for i in range(100_000)}
    big["w100000"] = to("w99999")
    assert [sorted(w for w, _ in c) for c in cycles(big)] == [["w100000", "w99999"]]


def test_a_cycle_through_a_collective_is_a_deadlock_and_the_rank_not_joined_is_not_blamed_alone():
    """Rollout/0 waits in a broadcast (gloo: entry known, completion not) that Learner/0 joins only after its
    ray.get on Rollout/0.ready returns, queued behind Rollout/0's running pull."""
    st = gloo_pair()
    entered(st, "Learner/0", 0, 2, T0 - 5)
    entered(st, "Rollout/0", 1, 2, T0 - 5)
    phase(st, "Rollout/0", "pull", T0, call=3)
    entered(st, "Rollout/0", 1, 3, T0 + 0.1)
    phase(st, "Learner/0", "push", T0 + 0.2, call=3, waits_on=["Rollout/0.ready"])
    (a,) = deadlocks(st, T0 + 5.5)
    assert a.message.startswith(
        "deadlock: Rollout/0.pull #3 waits for Learner/0 to join broadcast #3 of group default_pg (it is in push #3), "
        "which waits for Rollout/0.ready, queued behind Rollout/0.pull #3"), a.message
    assert a.evidence["cycle"] == [["Rollout/0", "Learner/0: broadcast #3 of group default_pg"],
                                   ["Learner/0", "Rollout/0.ready"]]
    # the collective rule alone would blame Learner/0 for not joining: the deadlock explains it
    assert [x.code for x in diagnosis.diagnose(st, T0 + 12) if x.severity != "info"] == ["deadlock"]


def test_a_gloo_rank_that_went_on_to_its_next_call_is_not_inside_the_broadcast_it_entered():
    """gloo's Flight Recorder never says a collective completed: Learner/0's broadcast #5 returned and it went
    on to train for 30 s, while Rollout/0 asks it something, queued behind the training. Both wait their turn."""
    st = gloo_pair()
    entered(st, "Rollout/0", 1, 4, T0 - 5)
    phase(st, "Learner/0", "push", T0, call=5)
    entered(st, "Learner/0", 0, 5, T0 + 0.1)
    phase(st, "Learner/0", "train", T0 + 0.2, call=5)
    phase(st, "Rollout/0", "refresh", T0 + 0.3, call=5, waits_on=["Learner/0.get_version"])
    assert deadlocks(st, T0 + 20) == []


def test_a_dead_actors_last_wait_is_no_edge_and_a_ray_wait_for_any_one_is_none():
    st = deadlocked()
    st.apply(ev.RayEvent(src="driver", target="Inference/0", ts=T0 + 1, state="DEAD"))
    assert deadlocks(st, T0 + 20) == []

    class Ref:
        def __init__(self, n: int):
            self.n = n

        def binary(self) -> bytes:
            return bytes([self.n])

    book = RefBook()
    refs = [Ref(1), Ref(2)]
    book.sent("Trainer/0", "weights_ready", refs[0])
    book.sent("Inference/0", "generate", refs[1])
    assert Wait(book, refs, lambda e: None, 60.0, None).waits_on() == ["Trainer/0.weights_ready",
                                                                        "Inference/0.generate"]
    assert Wait(book, refs, lambda e: None, 60.0, None, whole=False, num_returns=1).waits_on() == []
    assert len(Wait(book, refs, lambda e: None, 60.0, None, whole=False, num_returns=2).waits_on()) == 2


def test_a_chain_of_waits_names_its_end_and_its_waiters_are_blocked_by_it():
    """The driver waits on Trainer/0.step, which waits on Inference/0.generate, which hangs: each of the three
    is slower than its own history, but the waiters are blocked by the end, not late of their own."""
    st = job()
    for i in range(4):  # a healthy history: each call a second
        t = T0 - 40 + 5 * i
        phase(st, "driver", "ray.get", t, waits_on=["Trainer/0.step"])
        phase(st, "Trainer/0", "step", t, call=i + 1, waits_on=["Inference/0.generate"])
        phase(st, "Inference/0", "generate", t, call=i + 1)
        for src in ("Inference/0", "Trainer/0", "driver"):
            phase(st, src, "idle", t + 1.0)
    phase(st, "driver", "ray.get", T0, waits_on=["Trainer/0.step"])
    phase(st, "Trainer/0", "step", T0, call=5, waits_on=["Inference/0.generate"])
    phase(st, "Inference/0", "generate", T0, call=5)
    found = [(a.code, a.targets, sorted(a.evidence.get("blocked") or [])) for a in diagnosis.diagnose(st, T0 + 20)
             if a.severity != "info"]
    assert found == [("slower_than_usual", ["Inference/0"], ["Trainer/0", "driver"])]


def test_the_state_keeps_who_waits_so_a_pass_does_not_read_every_worker():
    st = deadlocked()
    assert st.waiting == {"driver", "Trainer/0", "Inference/0"}
    phase(st, "Inference/0", "generate", T0 + 1, call=3)  # its wait answered, the method goes on
    st.apply(ev.WorkerEvent(src="Trainer/0", role="Trainer", rank=0, node="node-a", pid=101, ts=T0 + 2))  # anew
    assert st.waiting == {"driver"}
    assert deadlocks(st, T0 + 30) == []


def test_the_book_of_calls_keeps_the_newest_half_and_turns_once_when_two_threads_see_it_full():
    from gkd_core.integrations import waits

    book = waits.RefBook()

    class Ref:
        def __init__(self, i: int):
            self.i = i

        def binary(self) -> bytes:
            return self.i.to_bytes(28, "little")

    for i in range(waits.BOOK_MAX):
        book.sent("Callee/0", "answer", Ref(i))
    assert book.newer == {}  # full: turned into the older half
    full = book._older
    book.sent("Callee/1", "answer", Ref(waits.BOOK_MAX))
    book.turn(full)  # a second thread that saw the same half full: nothing more is dropped
    assert book.who(Ref(0)) == ("Callee/0", "answer") and book.who(Ref(waits.BOOK_MAX)) == ("Callee/1", "answer")


def pipeline() -> RunState:
    """A rollout that waits on an HTTP request to the inference server its node's pid 200 listens for, and the
    driver on the rollout; each with a healthy history of one-second calls."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, role, pid in (("driver", "driver", 100), ("Rollouter/0", "Rollouter", 101), ("Server/0", "Server", 200)):
        st.apply(ev.WorkerEvent(src=src, role=role, rank=0, node="node-a", pid=pid, ts=T0 - 50))
    return st


REQUEST = HttpWait("POST", "127.0.0.1:8000", "/generate", 200)


def test_an_http_wait_is_said_and_read_back_and_an_actor_call_is_none():
    assert REQUEST.said() == "http POST 127.0.0.1:8000/generate @200"
    assert HttpWait.parse(REQUEST.said()) == REQUEST
    assert HttpWait.parse("http GET [::1]:80 @0") == HttpWait("GET", "[::1]:80", "", 0)
    assert HttpWait.parse("Trainer/0.step") is None and HttpWait.parse("http POST x/y @pid") is None
    assert REQUEST.spoken("Server/0") == "POST /generate on 127.0.0.1:8000 (Server/0)"
    assert HttpWait("GET", "10.0.0.9:80", "/", 0).spoken() == "GET / on 10.0.0.9:80 (not served on this node)"


def test_a_request_in_flight_is_an_edge_to_the_worker_listening_on_its_node():
    st = pipeline()
    phase(st, "driver", "ray.get", T0, waits_on=["Rollouter/0.rollout"])
    phase(st, "Rollouter/0", "rollout", T0, call=5, waits_on=[REQUEST.said()])
    phase(st, "Server/0", "POST /generate", T0, call=17)
    graph = wait_graph(st)
    assert graph["Rollouter/0"] == [Edge("Server/0", "POST /generate on 127.0.0.1:8000", T0, request=True)]
    # the same pid on another node, or no pid (a server outside this node): nobody of the run
    st.apply(ev.WorkerEvent(src="Server/0", role="Server", rank=0, node="node-b", pid=200, ts=T0 + 1))
    phase(st, "Server/0", "POST /generate", T0 + 1, call=1)
    assert "Rollouter/0" not in wait_graph(st)
    phase(st, "Rollouter/0", "rollout", T0 + 2, call=5, waits_on=[HttpWait("POST", "10.0.0.9:80", "/", 0).said()])
    assert "Rollouter/0" not in wait_graph(st)


def pipeline_with_healthy_rounds(round_s: float):
    """``pipeline()`` with four healthy rounds before T0 (driver -> Rollouter/0.rollout -> the server's request),
    each ``round_s`` long: the history a late round is judged against."""
    st = pipeline()
    for i in range(4):
        t = T0 - 40 + 5 * i
        phase(st, "driver", "ray.get", t, waits_on=["Rollouter/0.rollout"])
        phase(st, "Rollouter/0", "rollout", t, call=i + 1, waits_on=[REQUEST.said()])
        phase(st, "Server/0", "POST /generate", t, call=i + 1)
        for src in ("Server/0", "Rollouter/0", "driver"):
            phase(st, src, "idle", t + round_s)
    return st


def test_a_server_whose_request_stalls_is_named_and_the_rollout_and_driver_are_blocked_by_it():
    """The pipeline's chain through HTTP: the server is the end, named; the rollout awaiting its request and the
    driver awaiting the rollout are blocked by it, not late of their own."""
    st = pipeline_with_healthy_rounds(round_s=1.0)  # each round a second
    phase(st, "driver", "ray.get", T0, waits_on=["Rollouter/0.rollout"])
    phase(st, "Rollouter/0", "rollout", T0, call=5, waits_on=[REQUEST.said()])
    phase(st, "Server/0", "POST /generate", T0, call=5)
    found = [(a.code, a.targets, sorted(a.evidence.get("blocked") or [])) for a in diagnosis.diagnose(st, T0 + 20)
             if a.severity != "info"]
    assert found == [("slower_than_usual", ["Server/0"], ["Rollouter/0", "driver"])]
    # and the header says which wait holds the job: the request, at the end of the driver's chain
    for alert in diagnosis.diagnose(st, T0 + 20):
        st.apply(alert)
    assert what_holds(st, T0 + 20) == ("an inference request in a server: Server/0, 1 POST /generate in flight, the "
                                       "oldest 20 s (driver → Rollouter/0.rollout → Server/0: POST /generate on "
                                       "127.0.0.1:8000)")


def test_a_rollout_awaiting_a_tool_outside_the_run_is_named_with_the_tools_address_and_process():
    """The request's server is no worker of the run (a sandbox the driver started): the rollout is the worker
    named, and the alert and the header say the request, its address and the process serving it."""
    st = pipeline()
    tool = HttpWait("POST", "127.0.0.1:9000", "/run", 4242)
    detail = "waiting for POST /run on 127.0.0.1:9000 (pid 4242: python tool_server.py)"
    for i in range(4):  # a healthy history: each round a second
        t = T0 - 40 + 5 * i
        phase(st, "driver", "ray.get", t, waits_on=["Rollouter/0.rollout"])
        phase(st, "Rollouter/0", "rollout", t, call=i + 1)
        for src in ("Rollouter/0", "driver"):
            phase(st, src, "idle", t + 1.0)
    phase(st, "driver", "ray.get", T0, waits_on=["Rollouter/0.rollout"])
    st.apply(ev.PhaseEvent(src="Rollouter/0", phase="rollout", started=T0, call=5, waits_on=[tool.said()], ts=T0,
                           detail=detail))
    assert external_request(st, st.workers["Rollouter/0"]) == tool
    assert external_request(st, st.workers["driver"]) is None  # an actor call, not a request
    alerts = [a for a in diagnosis.diagnose(st, T0 + 20) if a.severity != "info"]
    # said as the wait outside the job it is, though the rollout is late by its own history too (the same
    # finding as where the rollout is a chain's end: slime's producer, which is its queue's actor)
    assert [(a.code, a.targets, sorted(a.evidence.get("blocked") or [])) for a in alerts] == [
        ("external_wait", ["Rollouter/0"], ["driver"])]
    assert detail.removeprefix("waiting for ") in alerts[0].message
    assert alerts[0].evidence["external"] == "POST /run on 127.0.0.1:9000"
    assert "no worker of the run" in alerts[0].hint
    for alert in alerts:
        st.apply(alert)
    assert what_holds(st, T0 + 20) == ("an external call: Rollouter/0 waits for POST /run on 127.0.0.1:9000 "
                                       "(pid 4242: python tool_server.py)")


def test_a_waiter_is_not_named_before_the_worker_at_work_on_its_call_has_been_judged():
    """The rollout began its method a moment before the server began its request: the rollout crosses the
    straggler floor first, but the server at work on its request is judged first, by its own measure; once the
    server is named, the rollout is its blocked."""
    st = pipeline()
    for i in range(4):  # a healthy history: each round a second
        t = T0 - 40 + 5 * i
        phase(st, "Rollouter/0", "rollout", t, call=i + 1, waits_on=[REQUEST.said()])
        phase(st, "Server/0", "POST /generate", t, call=i + 1)
        for src in ("Server/0", "Rollouter/0"):
            phase(st, src, "idle", t + 0.5)
    phase(st, "Rollouter/0", "rollout", T0, call=5, waits_on=[REQUEST.said()])
    phase(st, "Server/0", "POST /generate", T0 + 0.3, call=5)
    assert [a.targets for a in diagnosis.diagnose(st, T0 + 5.2) if a.severity != "info"] == []  # the window
    found = [(a.targets, sorted(a.evidence.get("blocked") or [])) for a in diagnosis.diagnose(st, T0 + 5.4)
             if a.severity != "info"]
    assert found == [(["Server/0"], ["Rollouter/0"])]
    # a wait on a worker busy with another call (queued behind it) is no work on this one: the waiter is named
    phase(st, "Server/0", "GET /health", T0 + 0.4, call=1)
    assert [a.targets for a in diagnosis.diagnose(st, T0 + 5.4) if a.severity != "info"] == [["Rollouter/0"]]


def test_a_driver_is_not_named_before_the_rank_that_has_not_joined_its_trainers_all_reduce():
    """The driver waits on both trainer ranks; rank 0 entered the all-reduce a moment after the driver's wait
    began, rank 1 is stuck in its compute and never joins. The driver crosses its own history's floor first (its
    set-up waits were short), but the collective's own rule judges the rank that has not joined: the driver
    waits for that, and is then the rank's blocked."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src, rank in (("driver", 0), ("Trainer/0", 0), ("Trainer/1", 1)):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=rank, node="node-a", pid=100 + rank,
                                ts=T0 - 50))
    for i in range(3):  # its set-up: three short waits
        phase(st, "driver", "ray.get", T0 - 40 + 5 * i, waits_on=["Trainer/0.ready"])
        phase(st, "driver", "idle", T0 - 39 + 5 * i)
    for src in ("Trainer/0", "Trainer/1"):
        phase(st, src, "train", T0 - 20)
    phase(st, "driver", "ray.get", T0, waits_on=["Trainer/0.train", "Trainer/1.train"])
    for src, rank in (("Trainer/0", 0), ("Trainer/1", 1)):  # the all-reduce before, both joined and left
        st.apply(ev.CollectivesEvent(src=src, ts=T0 - 1, groups=[ev.CollectiveProgress(
            group="default_pg", rank=rank, world=2, entered=40, op="all_reduce", entered_at=T0 - 1.2, left=40,
            left_at=T0 - 1.1)]))
    st.apply(ev.CollectivesEvent(src="Trainer/0", ts=T0 + 0.4, groups=[ev.CollectiveProgress(
        group="default_pg", rank=0, world=2, entered=41, op="all_reduce", entered_at=T0 + 0.4, left=40,
        left_at=T0 - 1.1)]))
    assert [(a.code, a.targets) for a in diagnosis.diagnose(st, T0 + 5.3) if a.severity != "info"] == []
    found = [(a.code, a.targets, sorted(a.evidence.get("blocked") or [])) for a in diagnosis.diagnose(st, T0 + 8)
             if a.severity != "info"]
    assert found and found[0][:2] == ("collective_not_joined", ["Trainer/1"]), found
    assert {targets[0] for _, targets, _ in found} == {"Trainer/1"} and "driver" in found[0][2], found


def test_a_waiter_others_wait_behind_is_held_too_while_its_chains_end_is_fresh_work():
    """The driver waits on the rollout, the rollout on the server's request; all three began together. The
    driver and the rollout cross the floor a moment before the server is judged: the rollout's finding, which
    the driver's chain ends in, is held like any waiter's (it was named for a pass, under load); then the
    server is named, both blocked by it."""
    st = pipeline_with_healthy_rounds(round_s=0.2)  # each round a fifth of a second
    phase(st, "driver", "ray.get", T0, waits_on=["Rollouter/0.rollout"])
    phase(st, "Rollouter/0", "rollout", T0, call=5, waits_on=[REQUEST.said()])
    phase(st, "Server/0", "POST /generate", T0 + 0.05, call=5)
    assert [a.targets for a in diagnosis.diagnose(st, T0 + 5.02) if a.severity != "info"] == []
    found = [(a.targets, sorted(a.evidence.get("blocked") or [])) for a in diagnosis.diagnose(st, T0 + 5.2)
             if a.severity != "info"]
    assert found == [(["Server/0"], ["Rollouter/0", "driver"])]
