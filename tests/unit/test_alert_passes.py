"""The supervisor's passes of the diagnosis (gkd_core/supervisor/alerts.py ``Passes``): one when due, taken in turns,
its findings said once it ends, the next as late as it cost; a whole pass in its place at the run's end; and the time
a pass judges at when the supervisor is behind its ingest (``judged_at``)."""

from __future__ import annotations

from test_pass_cost import T0, busy_run

from gkd_core import diagnosis
from gkd_core.diagnosis.rules import RULES, Settings
from gkd_core.supervisor import alerts


class Clock:
    """A pass's rules that each take ``rule_s`` of a fake clock, for the turns' budget."""

    def __init__(self, monkeypatch, rule_s: float):
        self.t = 0.0
        monkeypatch.setattr(diagnosis.time, "perf_counter", self.read)
        monkeypatch.setattr(alerts.time, "perf_counter", self.read)
        self.rule_s = rule_s

    def read(self) -> float:
        self.t += self.rule_s / 2  # (a rule reads the clock before and after: rule_s between)
        return self.t


def test_a_pass_is_taken_in_turns_said_once_it_ends_and_the_next_is_due_as_late_as_it_cost(monkeypatch):
    st = busy_run()
    begun = []

    def begin() -> diagnosis.Pass:
        begun.append(len(begun))
        return diagnosis.Pass(st, T0 + 10.7, Settings())

    Clock(monkeypatch, rule_s=alerts.PASS_TURN_S)  # each rule spends about a turn's budget: a rule or two a turn
    passes = alerts.Passes()
    said = [passes.turn(100.0 + 0.05 * i, begin) for i in range(len(RULES))]
    ended = [i for i, found in enumerate(said) if found is not None]
    assert len(ended) == 1 and said[ended[0]] == [] and begun == [0]  # one pass, said once, when it ended
    assert ended[0] >= len(RULES) // 2 - 1  # in turns: the ingest read between them
    assert passes.last_s > 0 and len(passes.times.said()) == 1
    due = 100.0 + max(alerts.ALERT_EVERY_S, alerts.ALERT_SHARE_INV * passes.last_s)
    assert passes.turn(due - 0.01, begin) is None and begun == [0]  # not due yet: no pass begun
    assert passes.turn(due, begin) is None and begun == [0, 1]
    assert said[ended[0] + 1:] == [None] * (len(said) - ended[0] - 1)


def test_a_whole_pass_in_place_of_the_one_under_way_leaves_nothing_of_it_to_say(monkeypatch):
    st = busy_run()
    Clock(monkeypatch, rule_s=alerts.PASS_TURN_S)
    passes = alerts.Passes()
    assert passes.turn(100.0, lambda: diagnosis.Pass(st, T0 + 10.7, Settings())) is None  # under way
    passes.drop()  # (the run ended: the supervisor takes a whole pass at once)
    assert passes.turn(100.05, lambda: diagnosis.Pass(st, T0 + 10.7, Settings())) is None  # a new one, due
    assert len(passes.times.said()) == 0


def test_a_supervisor_behind_its_ingest_judges_the_state_as_of_its_newest_heartbeat():
    """Seconds of events wait unread (the last read was cut off): the pass judges at the newest heartbeat taken in, so
    that nobody is silent for the beats the supervisor has not read yet; not behind, at the clock."""
    st = busy_run()
    newest = st.newest_beat
    late = newest + 30.0  # the clock, 30 s past the newest beat taken in
    assert alerts.judged_at(late, newest, behind=False) == late
    assert alerts.judged_at(late, newest, behind=True) == newest
    assert alerts.judged_at(newest - 1.0, newest, behind=True) == newest - 1.0  # (a sender's clock ahead)
    assert alerts.judged_at(late, 0.0, behind=True) == late  # (nothing taken in yet)
    cfg = Settings()
    assert diagnosis.diagnose(st, alerts.judged_at(late, newest, behind=True), cfg) == []
    assert "heartbeat_stale" in {a.code for a in diagnosis.diagnose(st, late, cfg)}


def test_a_pass_due_in_a_burst_waits_for_the_indexes_to_take_it_in_up_to_its_bound():
    """131,072 workers' first beats (or a step's phases) wait in the indexes' feeds: the pass due waits while the
    supervisor's ticks take them in a slice at a time (``diagnosis.keep_up``), so that it does not read the burst
    itself; and it waits PASS_WAIT_S at the most, so a run under a load that never lets up is still diagnosed."""
    st = busy_run()
    begun = []

    def begin() -> diagnosis.Pass:
        begun.append(1)
        return diagnosis.Pass(st, T0 + 10.7, Settings())

    passes = alerts.Passes()
    burst = alerts.PASS_BACKLOG + 1
    assert passes.turn(100.0, begin, backlog=burst) is None and begun == []  # due, waits for the burst
    assert passes.turn(100.0 + alerts.PASS_WAIT_S - 0.1, begin, backlog=burst) is None and begun == []
    passes.turn(100.1, begin, backlog=alerts.PASS_BACKLOG)
    assert begun == [1]  # taken in: it runs
    later = alerts.Passes()
    assert later.turn(100.0, begin, backlog=burst) is None and begun == [1]
    later.turn(100.0 + alerts.PASS_WAIT_S, begin, backlog=burst)
    assert begun == [1, 1]  # waited its bound: it runs
