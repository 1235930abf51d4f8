"""A teacher worker that answers every request with an error is named as itself, and a teacher frozen behind a
proxy started again is not called unreached: the two teacher faults the widened fault matrix found wanting."""

from __future__ import annotations

from test_diagnosis import T0, _teacher_run, named

from gkd_core import diagnosis
from gkd_core.telemetry import events as ev


def server(st, t, served, errors, received=None):
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=received or served, served=served,
                             workers={"teacher/0": served}, errors={"teacher/0": errors} if errors else {}, ts=T0 + t))


def test_a_teacher_worker_whose_every_answer_is_an_error_is_named_and_the_driver_is_blocked_by_it():
    st = _teacher_run()
    server(st, 2, served=20, errors=0)
    st.apply(ev.PhaseEvent(src="driver", phase="teacher_wait", step=7, started=T0 + 2.5, ts=T0 + 2.5,
                           detail="teacher unavailable, retrying: teacher microbatch 0 failed 2 times (the teacher "
                                  "answered: teacher/0: RuntimeError: CUDA error)"))
    server(st, 3, served=22, errors=2)  # two in a row: not yet (one bad request is no broken worker)
    assert named(st, T0 + 3.1, "teacher_errors") == []
    server(st, 4, served=26, errors=6)
    found = [a for a in diagnosis.diagnose(st, T0 + 4.1) if a.code == "teacher_errors"]
    assert [(a.targets, a.severity) for a in found] == [(["teacher/0"], "critical")]
    assert "its last 6" in found[0].message and "CUDA error" in found[0].message
    assert found[0].evidence["blocked"] == ["driver"]  # the cascade: it waits for the logprobs
    assert named(st, T0 + 4.1, "no_progress") == []

    server(st, 5, served=40, errors=7)  # it answers well again: the streak is over
    assert named(st, T0 + 5.1, "teacher_errors") == []


def test_errors_that_stopped_coming_are_let_go():
    """A worker that erred, then died or got no request since: its proxy says the same counts every second, and
    the streak, over for 10 s, is no finding (its death is another rule's)."""
    st = _teacher_run()
    server(st, 2, served=20, errors=0)
    server(st, 3, served=26, errors=6)
    assert named(st, T0 + 3.1, "teacher_errors") != []
    for t in range(4, 16):
        server(st, t, served=26, errors=6)
    assert named(st, T0 + 12.9, "teacher_errors") != []
    assert named(st, T0 + 15.1, "teacher_errors") == []


def test_errors_among_good_answers_are_no_broken_worker():
    st = _teacher_run()
    for t in range(2, 12):
        server(st, t, served=20 + 10 * t, errors=t)  # one error a second among ten answers
    assert named(st, T0 + 12, "teacher_errors") == []


def test_a_teacher_frozen_behind_a_proxy_started_again_is_not_serving_not_unreached():
    """The random trials' one miss: after the proxy was started again its counts begin at 0 while the client's
    go on, so "fewer received than sent" held for good; the proxy says it holds the requests (its queue): they
    arrived, and the teacher worker holding them is named."""
    st = _teacher_run()
    st.apply(ev.TeacherEvent(src="driver", side="client", sent=3000, completed=3000, ts=T0 + 2))
    st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=2720, served=2720, ts=T0 + 2))
    for t in range(3, 10):  # teacher/0 frozen from T0 + 3 with 4 requests of the client's in it; the proxy's
        # count came first, the client's (sent a moment before it) after: "nothing received since it sent"
        st.apply(ev.TeacherEvent(src="teacher/proxy", side="server", received=2724, served=2720, queue_depth=4,
                                 ts=T0 + t))
        st.apply(ev.TeacherEvent(src="driver", side="client", sent=3004, completed=3000, in_flight=4, ts=T0 + t + 0.5))
    assert named(st, T0 + 9.6, "teacher_unreached") == []
    assert named(st, T0 + 9.6, "teacher_not_serving") == [("teacher_not_serving", ["teacher/0"], "critical")]
