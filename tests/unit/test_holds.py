"""What holds a job that is not moving, as the header says it (gkd_core/diagnosis/holds.py): the kind of wait
at the end of the driver's chain, on states built from the events a watched job sends."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.diagnosis.holds import what_holds
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_tui.render_text import status_text

T0 = 1000.0


def job(*workers: str) -> RunState:
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 60))
    for src in ("driver", *workers):
        role, _, rank = src.partition("/")
        st.apply(ev.WorkerEvent(src=src, role=role, rank=int(rank) if rank else None, pid=100, ts=T0 - 50))
    return st


def phase(st, src, name, ts, call=None, waits_on=(), in_flight=0):
    st.apply(ev.PhaseEvent(src=src, phase=name, started=ts, call=call, waits_on=list(waits_on), ts=ts,
                           in_flight=in_flight))


def judged(st: RunState, now: float) -> str:
    """The state after the diagnosis's alerts (as the supervisor applies them), and what holds it then."""
    for a in diagnosis.changes(st, diagnosis.diagnose(st, now)):
        a.ts = now
        st.apply(a)
    return what_holds(st, now)


def test_a_server_whose_requests_stop_returning_holds_the_driver_waiting_on_it():
    st = job("Server/0", "Server/1")
    for n in range(1, 4):  # healthy rounds: both servers answer their 8 calls in 50 ms
        t = T0 + n
        phase(st, "driver", "ray.get", t, waits_on=["Server/0.generate", "Server/1.generate"])
        for s in ("Server/0", "Server/1"):
            phase(st, s, "generate", t, call=8 * n - 7, in_flight=8)
            phase(st, s, "idle", t + 0.05)
        phase(st, "driver", "idle", t + 0.06)
    t = T0 + 10
    phase(st, "driver", "ray.get", t, waits_on=["Server/1.generate"])
    phase(st, "Server/0", "generate", t, call=25, in_flight=8)
    phase(st, "Server/0", "idle", t + 0.05)
    phase(st, "Server/1", "generate", t, call=25, in_flight=8)
    assert what_holds(st, t + 2) == ""  # nothing wrong yet
    held = judged(st, t + 8)
    assert held == "an inference request in a server: Server/1, 8 generate in flight, the oldest 8 s", held
    assert "held by  an inference request in a server: Server/1" in status_text(st, t + 8)


def test_a_rank_that_never_joins_a_collective_holds_the_chain_through_it():
    st = job("Learner/0", "Rollout/0")
    phase(st, "driver", "ray.get", T0, waits_on=["Learner/0.push"])
    phase(st, "Learner/0", "push", T0, call=4)
    phase(st, "Rollout/0", "generate", T0, call=4)  # never enters broadcast #4
    st.apply(ev.CollectivesEvent(src="Learner/0", ts=T0, groups=[ev.CollectiveProgress(
        group="weights", rank=0, world=2, entered=4, op="broadcast", entered_at=T0, left=3)]))
    st.apply(ev.CollectivesEvent(src="Rollout/0", ts=T0, groups=[ev.CollectiveProgress(
        group="weights", rank=1, world=2, entered=3, op="broadcast", entered_at=T0 - 5, left=3)]))
    held = judged(st, T0 + 8)
    assert held == "a collective: broadcast #4 of group weights, which Rollout/0 has not joined", held


def test_a_worker_in_a_socket_call_is_an_external_call_and_one_at_work_a_ray_wait():
    st = job("Fetcher/0")
    phase(st, "driver", "ray.get", T0, waits_on=["Fetcher/0.fetch"])
    phase(st, "Fetcher/0", "fetch", T0, call=1)
    st.apply(ev.AlertEvent(severity="warn", code="slower_than_usual", targets=["driver"], ts=T0 + 6))
    assert what_holds(st, T0 + 8) == "a Ray wait: driver → Fetcher/0.fetch, running 8 s"
    st.apply(ev.StackEvent(src="supervisor", target="Fetcher/0", method="py-spy", ts=T0 + 7, text=(
        'Thread 0x1 (active): "MainThread"\n'
        "    _read_status (http/client.py:279)\n"
        "    readinto (socket.py:706)\n"
        "    fetch (job.py:12)\n")))
    assert what_holds(st, T0 + 8).startswith("an external call: Fetcher/0 in `fetch` (job.py:12)")


def test_a_deadlock_holds_it_and_a_driver_waiting_on_nothing_nameable_says_so():
    st = job()
    phase(st, "driver", "ray.get", T0)
    st.apply(ev.AlertEvent(severity="warn", code="slower_than_usual", targets=["driver"], ts=T0 + 6))
    assert what_holds(st, T0 + 8) == "a Ray wait on a task or an object (no actor call of the job's to follow)"
    st.apply(ev.AlertEvent(severity="critical", code="deadlock", targets=["A/0", "B/0"], ts=T0 + 7))
    assert what_holds(st, T0 + 8) == "a cycle of waits: the deadlock above"
