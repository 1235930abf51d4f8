"""state/pipeline: a pipeline's view from the events a real one sends (flow, sends, phases): a queue's rates
from its puts and depth, going to 0 when its worker goes quiet; a server's requests in flight and the oldest's
age; an address outside the job with who waits on it; each stage's idle share over the last minute."""

from __future__ import annotations

import pytest

from gkd_core.state import RunState
from gkd_core.state.pipeline import pipeline_view
from gkd_core.telemetry import events as ev

T0 = 1_795_000_000.0
QUEUE = "MessageQueue.samples"


def a_pipeline(until_s: float, stall_at_s: float) -> RunState:
    """A queue fed 5 a second and drained as fast until ``stall_at_s``; then the rollouter waits on a tool
    that never answers, the server holds one request, and the trainer waits on the queue."""
    st = RunState()
    for pid, src in enumerate(["MessageQueue/0", "InferenceServer/0", "Rollouter/0", "Trainer/0", "driver"]):
        st.apply(ev.WorkerEvent(src=src, role=src.split("/")[0], rank=0, node="n1", pid=100 + pid, ts=T0))
    st.apply(ev.SendsEvent(src="Rollouter/0", to=["MessageQueue/0.put_sample"], ts=T0))
    st.apply(ev.SendsEvent(src="Trainer/0", to=["MessageQueue/0.get_sample", "Rollouter/0.update_param_version"],
                           ts=T0))
    st.apply(ev.SendsEvent(src="driver", to=["Rollouter/0.run", "Trainer/0.train"], ts=T0))
    t = 0.0
    while t <= min(until_s, stall_at_s):
        puts = int(5 * t)
        st.apply(ev.FlowEvent(src="MessageQueue/0", ts=T0 + t, calls={"put_sample": puts, "get_sample": puts - 2},
                              queues=[ev.QueueDepth(QUEUE, 2 + int(t) % 2, puts)]))
        st.apply(ev.FlowEvent(src="InferenceServer/0", ts=T0 + t, calls={"POST /generate": puts + 1}))
        for src in ("Trainer/0", "Rollouter/0"):  # half the time waiting on the queue or a request
            st.apply(ev.PhaseEvent(src=src, phase="train", ts=T0 + t, waits_on=["MessageQueue/0.get_sample"]))
            st.apply(ev.PhaseEvent(src=src, phase="train", ts=T0 + t + 1, waits_on=[]))
        t += 2.0
    if until_s > stall_at_s:
        stall = T0 + stall_at_s + 1
        st.apply(ev.PhaseEvent(src="InferenceServer/0", phase="POST /generate", started=stall, ts=stall))
        st.apply(ev.PhaseEvent(src="Rollouter/0", phase="run", ts=stall,
                               waits_on=["http POST 127.0.0.1:4242/run @999",
                                         "http POST 127.0.0.1:8000/generate @101"]))  # (the server's own pid)
        st.apply(ev.PhaseEvent(src="Trainer/0", phase="train", ts=stall, waits_on=["MessageQueue/0.get_sample"]))
    return st


def test_a_flowing_queue_has_its_rates_and_a_stalled_one_goes_to_zero():
    healthy = pipeline_view(a_pipeline(20, 20), T0 + 20)
    (q,) = healthy.queues
    assert (q.worker, q.name, q.depth) == ("MessageQueue/0", QUEUE, 2)
    assert q.puts_per_s == pytest.approx(5.0) and q.takes_per_s == pytest.approx(5.0)
    (server,) = healthy.servers
    assert (server.worker, server.route, server.in_flight) == ("InferenceServer/0", "POST /generate", 0)
    assert server.per_s == pytest.approx(5.0)
    assert healthy.peers == []

    stalled = pipeline_view(a_pipeline(60, 20), T0 + 60)
    (q,) = stalled.queues
    assert q.puts_per_s == 0.0 and q.takes_per_s == 0.0 and q.depth == 2
    assert q.depths == [2] * 11  # its depth at each flow (the plots' points)


def test_a_stalled_pipeline_shows_the_server_holding_a_request_and_the_address_outside_it():
    view = pipeline_view(a_pipeline(60, 20), T0 + 60)
    (server,) = view.servers
    assert (server.route, server.in_flight, server.oldest_s) == ("POST /generate", 1, pytest.approx(39.0))
    # the tool's address, with who waits on it; the server's own address is its row, not an outside one's
    (peer,) = view.peers
    assert (peer.address, peer.pid, peer.waiters, peer.oldest_s) == ("127.0.0.1:4242", 999, ["Rollouter/0"],
                                                                     pytest.approx(39.0))


def test_each_stage_has_its_idle_share_of_the_last_minute_and_the_driver_none():
    healthy = dict(pipeline_view(a_pipeline(20, 20), T0 + 21).idle)  # (its last stretch ends at 21)
    assert healthy.keys() == {"Rollouter/0", "Trainer/0"}  # not the queue or server (rows of their own), nor driver
    assert healthy["Trainer/0"] == pytest.approx(0.5, abs=0.05)
    stalled = dict(pipeline_view(a_pipeline(120, 20), T0 + 120).idle)
    assert stalled["Trainer/0"] == pytest.approx(1.0)  # waiting on the queue all of the last minute


def test_a_queues_taken_samples_staleness_is_in_its_row_and_over_time_in_the_plots():
    """Its worker's counts of the samples taken by versions behind: the row says them so far, the pane as a
    histogram in words, and the plots the average of those taken between two counts."""
    from gkd_tui.figures import figures
    from gkd_tui.widgets.pipeline_pane import staleness

    st = RunState()
    st.apply(ev.WorkerEvent(src="MessageQueue/0", role="MessageQueue", rank=0, node="n1", pid=100, ts=T0))
    for t, behind in ((0, [2, 0, 0]), (2, [4, 2, 0]), (4, [4, 2, 0]), (6, [4, 2, 2, 0, 0, 1, 9, 9])):
        st.apply(ev.FlowEvent(src="MessageQueue/0", ts=T0 + t, calls={"put_sample": 10 * t},
                              queues=[ev.QueueDepth(QUEUE, 1, 10 * t, behind)]))
    (q,) = pipeline_view(st, T0 + 6).queues
    assert q.behind == [4, 2, 2, 0, 0, 1]  # (a sender's longer list cut to the buckets there are)
    assert staleness(q.behind) == "0 ×4  1 ×2  2 ×2  5+ ×1"
    points = st.series.queues[f"MessageQueue/0 {QUEUE}"]
    # two at 0, then two taken at 0 and two at 1; none taken; then two at 2 and one at 5 or more
    assert [p.behind for p in points] == [0.0, pytest.approx(0.5), None, pytest.approx(3.0)]
    depth, stale = figures("pipeline", st)
    assert stale.title == f"samples taken, versions behind: MessageQueue/0 {QUEUE} 3.0 lately"
    assert [len(line.x) for line in stale.lines] == [3]
