"""A driver's commands (gkd_core/telemetry/commands.py): each handed to the handler its driver declares for the
arguments' type, and every one answered with the request's id: an op it does not carry out refused, one no
version knows refused, a handler's failure answered (never the driver's end)."""

from __future__ import annotations

import time

from gkd_core.telemetry import events as ev
from gkd_core.telemetry import ops
from gkd_core.telemetry.answers import Paused
from gkd_core.telemetry.commands import Command, CommandInbox, DriverCommands, Reply


class Pauses(DriverCommands):
    who = "this test's driver"

    def handlers(self):
        return {ops.PauseArgs: self.pause, ops.ResumeArgs: self.resume}

    def pause(self, args: ops.PauseArgs, reply: Reply) -> None:
        reply(True, Paused(outcome=f"paused by {reply.by}", for_s=args.for_s))

    def resume(self, args: ops.ResumeArgs, reply: Reply) -> None:
        raise RuntimeError("the resume broke")


def test_each_command_goes_to_its_handler_and_every_one_is_answered_with_its_id():
    said: list[ev.Event] = []
    driver = Pauses(CommandInbox(address=""), said.append)
    for n, (op, args) in enumerate((("pause", {"for_s": 5}), ("cancel", {}), ("resume", {}), ("someday", {}),
                                    ("pause", {"for_s": "1h"})), 1):
        driver.carry_out(Command(op=op, args=args, by="alice", id=n))
    answers = [(e.request, e.op, e.ok, e.result) for e in said if isinstance(e, ev.ActionEvent)]
    assert answers[0] == (1, "pause", True, Paused(outcome="paused by alice", for_s=5.0))
    assert answers[1] == (2, "cancel", False, "this test's driver does not carry out 'cancel'")
    assert answers[2] == (3, "resume", False, "RuntimeError: the resume broke")
    assert answers[3] == (4, "someday", False, "this test's driver does not know the op 'someday'")
    assert answers[4][:3] == (5, "pause", False) and "for_s" in answers[4][3]
    assert len(answers) == 5


def test_an_inbox_with_no_supervisor_waits_its_timeout_instead_of_returning_at_once():
    """A driver held in a pause serves its commands in a loop of ``poll(timeout)``: with no supervisor to hear
    from, a poll that returned at once would spin a core."""
    inbox = CommandInbox(address="")
    t0 = time.monotonic()
    assert inbox.poll(0.2) == []
    assert time.monotonic() - t0 >= 0.19
