"""The node agent's word that its node's CPU is held outside the run: when it is said, how often, and
that the diagnosis reads it from the state the agent's events make."""

from __future__ import annotations

from gkd_core import diagnosis
from gkd_core.diagnosis.rules.workers import node_busy
from gkd_core.node.cpu_load import FREE_SAMPLES, NODE_BUSY, Load, NodeLoadWatch
from gkd_core.state import RunState
from gkd_core.telemetry import events as ev
from gkd_core.telemetry import wire
from gkd_core.telemetry.reporter import Reporter

T0 = 1000.0


def test_held_needs_every_core_busy_and_a_share_of_them_outside_the_run():
    assert Load(cores=2, busy=1.95, outside=1.9, top=[]).held  # two busy loops of someone else's
    assert not Load(cores=2, busy=2.0, outside=0.2, top=[]).held  # the run itself keeps the node busy
    assert not Load(cores=2, busy=1.1, outside=1.0, top=[]).held  # room left: nobody waits for a core
    words = Load(cores=2, busy=2.0, outside=1.9, top=[(7, "python3", 0.96), (8, "gzip", 0.9)]).words("n1")
    assert words.startswith("node n1: 2.0 of its 2 cores busy, 1.9 of them held by processes outside this run "
                            "(pid 7 python3 (96 %), pid 8 gzip (90 %))")


def said(rep: Reporter) -> list[ev.Event]:
    out = [wire.decode(frame) for frame in rep._queue]
    rep._queue.clear()
    return out


def test_the_agent_says_it_once_follows_who_holds_it_and_says_when_it_is_free_again():
    rep = Reporter("agent/n1", ingest="", run="r", start=False)
    watch = NodeLoadWatch("n1", rep, load=None)  # type: ignore[arg-type]  # fed by hand: note()
    held = Load(cores=2, busy=2.0, outside=1.9, top=[(7, "python3", 0.96)])
    watch.note(held)
    first = said(rep)
    assert [(e.kind, getattr(e, "phase", getattr(e, "level", ""))) for e in first] == [("log", "info"),
                                                                                     ("phase", NODE_BUSY)]
    assert first[1].detail == held.words("n1")
    watch.note(held)
    assert said(rep) == []  # said once, not every interval
    other = held._replace(top=[(9, "gzip", 0.9)])
    watch.note(other)  # someone else holds it now: the detail follows, the log is not said again
    assert [(e.kind, e.detail) for e in said(rep)] == [("phase", other.words("n1"))]
    lull = Load(cores=2, busy=1.8, outside=0.15, top=[(9, "gzip", 0.15)])  # the run's own turn on the cores
    assert not lull.held and lull.still_held
    for _ in range(2 * FREE_SAMPLES):
        watch.note(lull)
    assert said(rep) == [] and watch.busy  # once said, it holds through the run's busiest moments
    free = Load(cores=2, busy=0.5, outside=0.1, top=[])
    for _ in range(FREE_SAMPLES - 1):
        watch.note(free)
        assert said(rep) == []  # a moment's lull is not the end of it
    watch.note(other)
    watch.note(free)
    assert said(rep) == [] and watch.busy
    for _ in range(FREE_SAMPLES):
        watch.note(free)
    assert [(e.kind, getattr(e, "phase", "")) for e in said(rep)] == [("log", ""), ("phase", "watching")]
    assert not watch.busy


def test_the_diagnosis_reads_the_agents_word_from_the_state_its_events_make():
    rep = Reporter("agent/n1", ingest="", run="r", start=False)
    rep.register("agent", node="n1")
    rep.set_phase("watching")
    watch = NodeLoadWatch("n1", rep, load=None)  # type: ignore[arg-type]  # fed by hand: note()
    watch.note(Load(cores=2, busy=2.0, outside=1.9, top=[(7, "python3", 0.96)]))
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0))
    for e in said(rep):
        st.apply(e)
    st.apply(ev.WorkerEvent(src="rollout/0", role="rollout", node="n1", pid=5, via="agent/n1", ts=T0))
    st.apply(ev.WorkerEvent(src="rollout/1", role="rollout", node="n1", pid=6, ts=T0))  # straight, no relay
    st.apply(ev.WorkerEvent(src="rollout/2", role="rollout", node="n2", pid=6, ts=T0))  # another node
    words = st.workers["agent/n1"].detail
    assert "held by processes outside this run (pid 7 python3 (96 %))" in words
    assert [node_busy(st, st.workers[f"rollout/{r}"]) for r in range(3)] == [words, words, ""]
    assert node_busy(st, st.workers["agent/n1"]) == ""  # the agent's own silence is not excused by its word



def test_a_node_busy_for_longer_than_its_peers_is_no_straggler():
    """The agent's phase says what its node is, not work it does: three nodes busy at once, two free again
    in a second, the third busy for a minute names nobody."""
    st = RunState()
    st.apply(ev.RunEvent(state="running", ts=T0 - 10))
    for n in ("n1", "n2", "n3"):
        st.apply(ev.WorkerEvent(src=f"agent/{n}", role="agent", node=n, pid=5, ts=T0 - 10))
        st.apply(ev.PhaseEvent(src=f"agent/{n}", phase=NODE_BUSY, started=T0, ts=T0))
    for n in ("n1", "n2"):
        st.apply(ev.PhaseEvent(src=f"agent/{n}", phase="watching", started=T0 + 1, ts=T0 + 1))
    for t in range(1, 61):
        for n in ("n1", "n2", "n3"):
            st.apply(ev.HeartbeatEvent(src=f"agent/{n}", ts=T0 + t, cpu=1.0))
    assert [(a.code, a.targets) for a in diagnosis.diagnose(st, T0 + 60)] == []
