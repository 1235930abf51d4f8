"""The dashboard's requests and their outcomes (gkd_tui/answers.py): each outcome shown once, whichever of
the supervisor's receipt and the driver's answer comes first."""

from __future__ import annotations

import typing

import msgspec
import pytest

from gkd_core.telemetry import answers, wire
from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import Cancelled, Forwarded, Noted
from gkd_tui.answers import PendingAnswers

RECEIPT = Forwarded(to="driver pid 7")


def driver_answer(request: int, ok: bool, result) -> ev.ActionEvent:
    return ev.ActionEvent(op="cancel", by="dashboard via ipc", ok=ok, result=result, request=request)


def test_a_forwarded_cancel_says_its_receipt_then_the_drivers_outcome_once():
    asked = PendingAnswers()
    request = asked.ask("cancel")
    assert asked.receipt(request, "cancel", RECEIPT) == "cancel: handed to the driver pid 7; its outcome will show here"
    assert asked.shown(request) is None  # on screen, nothing came meanwhile
    assert asked.answered(ev.ActionEvent(op="cancel", result=RECEIPT, request=request)) is None  # the receipt's event
    outcome = Cancelled(target="sync", outcome="sync 4 cancelled with rollout/1 pending after 3.1 s")
    assert asked.answered(driver_answer(request, True, outcome)) == \
        "cancel: sync 4 cancelled with rollout/1 pending after 3.1 s"
    assert asked.answered(driver_answer(request, True, outcome)) is None  # said once


def test_an_outcome_that_comes_while_its_receipt_is_on_its_way_to_the_screen_shows_after_it():
    """The receipt is said on a worker thread and shown through the app's; the driver's answer, heard on the
    app's thread in between, waits for it: the screen never says "handed to the driver" after the outcome."""
    asked = PendingAnswers()
    request = asked.ask("cancel")
    assert asked.receipt(request, "cancel", RECEIPT).startswith("cancel: handed to the driver")
    assert asked.answered(driver_answer(request, False, "the demo driver has nothing to cancel")) is None  # held
    assert asked.shown(request) == ("cancel failed: the demo driver has nothing to cancel", False)
    assert asked.shown(request) is None and asked.answered(driver_answer(request, False, "again")) is None


def test_an_outcome_that_comes_before_its_receipt_is_said_alone_and_a_stranger_is_not():
    asked = PendingAnswers()
    request = asked.ask("cancel")
    said = asked.answered(driver_answer(request, False, "no weight sync is under way (the last: sync 3 done)"))
    assert said == "cancel failed: no weight sync is under way (the last: sync 3 done)"
    assert asked.receipt(request, "cancel", RECEIPT) is None
    assert asked.answered(driver_answer(request + 1, True, "not ours")) is None
    assert asked.answered(driver_answer(0, True, "nobody asked")) is None


def test_a_watched_jobs_outcome_per_worker_and_a_reply_that_is_the_outcome():
    asked = PendingAnswers()
    request = asked.ask("cancel")
    per_worker = Cancelled(target="all", outcome={"Learner/0": "killed", "Learner/1": "no handle to it here"})
    assert asked.answered(driver_answer(request, False, per_worker)) == \
        "cancel failed: Learner/0: killed; Learner/1: no handle to it here"
    note = asked.ask("note")
    assert asked.receipt(note, "note", Noted(note="tried a smaller batch")) == "note: noted: tried a smaller batch"
    assert asked.answered(ev.ActionEvent(op="note", result=Noted(note="tried a smaller batch"), request=note)) is None


def test_every_answer_declared_is_in_the_union_an_action_carries():
    """An answer left out of ``AnyAnswer`` would be encoded on the record and refused when read back; a query's
    answer is never recorded, and one a sender says anyway (a snapshot's, whose state is raw bytes) is its text."""
    assert set(typing.get_args(answers.AnyAnswer)) == set(answers.Answer.__subclasses__()) - {
        answers.Pong, answers.Snapshot}
    _, forged = wire.decode_dict(b'{"kind": "action", "op": "snapshot", "result": {"answer": "snapshot"}}')
    assert isinstance(forged, ev.ActionEvent) and forged.result == '{"answer": "snapshot"}', forged
    assert forged.said() == 'snapshot: {"answer": "snapshot"}'
    # nor does the fast path take it as an answer: it goes the slow way above
    assert wire.decode_stampable(b'{"kind":"action","op":"snapshot","result":{"answer":"snapshot"},"ts":1.0}') is None
    with pytest.raises(wire.Rejected):  # and a malformed one is refused, never the reader's end
        wire.decode_dict(b'{"kind": "action", "ok": "x", "result": {"answer": "snapshot"}}')


@pytest.mark.parametrize("answer", [
    answers.Restarted(restart=2, changes=[("trainer.micro_batch", 8, 4, "rollout/1 ran out of memory")],
                      config="restarts/002.yaml"),
    Cancelled(target="all", mode="force", outcome={"Learner/0": "killed"}), RECEIPT,
    answers.Dumped(dump_id="d1", targets=["driver"], folder="stacks/d1"),
    answers.Recovered(stage="report", code="deadlock", targets=["a", "b"]),
    answers.RecoverySaid(said_now="restarts on deadlock, 3 an hour"),
])
def test_an_action_reads_back_as_the_answer_it_carried(answer):
    e = ev.ActionEvent(op="x", result=answer, request=7)
    back = wire.decode(wire.encode(e))
    assert isinstance(back, ev.ActionEvent) and back.result == answer and type(back.result) is type(answer)


def test_an_older_logs_untagged_answers_read_back_typed_and_nothing_of_them_is_lost():
    """A log written before the answers were tagged: each result read as the answer of its op (a receipt as a
    receipt), and one that is none of them kept as its text."""
    def old(op: str, result) -> ev.ActionEvent:
        e = wire.decode(msgspec.json.encode({"kind": "action", "op": op, "result": result, "request": 3}))
        assert isinstance(e, ev.ActionEvent)
        return e

    assert old("cancel", {"forwarded": True, "to": "driver pid 7"}).result == RECEIPT
    assert old("restart", {"restart": 2, "changes": [["a.b", 1, 2, ""]], "digest": "x"}).result == \
        answers.Restarted(restart=2, changes=[("a.b", 1, 2, "")], digest="x")
    assert old("dump_stacks", {"taking": ["driver"], "by": "the supervisor"}).result == \
        answers.Taking(taking=["driver"], by="the supervisor")
    assert old("recovery", {"said": "off"}).result == answers.RecoverySaid(said_now="off")
    assert old("someday", {"what": [1, 2]}).result == '{"what": [1, 2]}'
    assert old("cancel", ["a", 1]).result == '["a", 1]'

