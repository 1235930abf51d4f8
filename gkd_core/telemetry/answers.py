"""The answers of the control ops, one Struct each (``telemetry/ops`` declares which op answers with which),
and what the supervisor itself does on the record beside them (the recovery's steps, its notifications).

``ActionEvent.result`` is their tagged union, ``AnyAnswer`` (or the text of a refusal): a reader gets back
the answer that was given, typed, and each says itself in a person's words (``said``), which the CLI prints
and the dashboard shows. An older run's log, written before the answers were tagged, reads back through
``answer_from``.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

import msgspec


class Answer(msgspec.Struct, kw_only=True, tag_field="answer"):
    """What an op's carrier answered. The tag names the op (a receipt's, what it is): an action event's result
    is read back as the answer it was, and an older reader's extra fields are not refused."""

    def said(self) -> str:
        """The answer in a person's words (the CLI prints it, the dashboard shows it)."""
        return json.dumps(msgspec.to_builtins(self))


A = TypeVar("A", bound=Answer)


class Pong(Answer, tag="ping"):
    run: str = ""
    seq: int = 0
    state: str = ""
    pid: int = 0
    uptime_s: float = 0.0

    def said(self) -> str:
        return f"run {self.run}: {self.state}, event {self.seq}, the supervisor (pid {self.pid}) up {self.uptime_s:g} s"


class Snapshot(Answer, tag="snapshot"):
    seq: int = 0
    supervisor: dict[str, Any] = {}  # its pid, the run's folder, what it rejected, its driver
    state: msgspec.Raw = msgspec.Raw(b"null")  # the run's state (``state.encode_state``), read by who needs it

    def said(self) -> str:
        return f"the run's state as of event {self.seq}"


class Stopping(Answer, tag="stop"):
    driver_pid: int | None = None

    def said(self) -> str:
        who = (f"the driver (pid {self.driver_pid}) gets SIGTERM, then SIGKILL if it lingers" if self.driver_pid
               else "no driver is running")
        return f"stopping: {who}; the supervisor ends after it (`gkd-tui replay` shows the run afterwards)"


# a config's change: [key, old value, new value, the finding it follows from ("" for an override)]
ConfigChange = tuple[str, Any, Any, str]


class Restarted(Answer, tag="restart"):
    restart: int  # the restart's number (the driver's start after it)
    changes: list[ConfigChange] = []
    digest: str = ""  # the new config's
    config: str = ""  # where it was written, under the run's folder ("" on a dry run: nothing was)

    def said(self) -> str:
        lines = [f"restart {self.restart}: {self.config or '(dry run)'}"]
        lines += [f"  {key}: {old!r} -> {new!r}" + (f"    ({why})" if why else "")
                  for key, old, new, why in self.changes] or ["  (same config)"]
        return "\n".join(lines)


class IngestOpened(Answer, tag="open_ingest"):
    endpoint: str

    def said(self) -> str:
        return f"workers on other nodes report to {self.endpoint}"


class Noted(Answer, tag="note"):
    note: str

    def said(self) -> str:
        return f"noted: {self.note}"


class Forwarded(Answer, tag="forwarded"):
    """The supervisor's receipt for a request it handed to the driver: the answer is the driver's, to come."""

    to: str
    forwarded: bool = True  # (what a reader of the JSON before the answers were tagged looked for)

    def said(self) -> str:
        return f"handed to the {self.to}; its outcome follows"


class Taking(Answer, tag="taking"):
    """The supervisor's receipt for a stacks dump it takes itself (a job that is not ours): under way."""

    taking: list[str]
    by: str

    def said(self) -> str:
        return f"taking the stacks of {', '.join(self.taking) or 'nobody'} ({self.by})"


Receipt = Forwarded | Taking


class Dumped(Answer, tag="dump_stacks"):
    """A dump's end: every stack it took is on the record before it."""

    dump_id: str
    targets: list[str] = []
    folder: str = ""  # under the run's folder ("" when nothing was written to files)
    error: str = ""  # why it failed, when it did

    def said(self) -> str:
        where = f" in {self.folder}" if self.folder else ""
        return f"stacks of {', '.join(self.targets) or 'nobody'}{where}" + (f": {self.error}" if self.error else "")


class Cancelled(Answer, tag="cancel"):
    target: str = ""
    mode: str = ""
    # what became of it; a watched job's driver says it worker by worker
    outcome: str | dict[str, str] = ""

    def said(self) -> str:
        if isinstance(self.outcome, dict):
            return "; ".join(f"{who}: {what}" for who, what in self.outcome.items())
        return self.outcome


class Paused(Answer, tag="pause"):
    outcome: str
    for_s: float

    def said(self) -> str:
        return self.outcome


class Resumed(Answer, tag="resume"):
    outcome: str

    def said(self) -> str:
        return self.outcome


# the supervisor's own actions, on the record beside the answers to requests
RecoverStage = Literal["report", "restart", "replace", "report_written"]


class Recovered(Answer, tag="recover"):
    """A step of the recovery policy: a bug report taken, a restart, workers replaced, a report's archive."""

    stage: RecoverStage
    code: str = ""  # the alert it acts on
    targets: list[str] = []
    reason: str = ""
    report: str = ""  # the bug report (its path under the run's folder), or why there is none
    restart: int = 0  # the policy's restarts so far, after a restart
    error: str = ""

    def said(self) -> str:
        what = f"{self.stage} for {self.code} {', '.join(self.targets)}".strip()
        return what + (f": {self.error}" if self.error else f" ({self.reason})" if self.reason else "")


class RecoverySaid(Answer, tag="recovery"):
    said_now: str = msgspec.field(name="said")  # what the policy does, said anew as it acts

    def said(self) -> str:
        return self.said_now


class Notified(Answer, tag="notify"):
    to: str
    alert: str
    targets: list[str] = []
    kind: str = ""
    tries: int = 0
    error: str = ""

    def said(self) -> str:
        told = f"{self.kind} {self.alert} to {self.to} after {self.tries} tries"
        return told + (f": {self.error}" if self.error else "")


# what an action can carry, a tagged union (``ActionEvent.result``): every answer declared above but the queries'
# (``Pong``, ``Snapshot``: a query is never recorded; tests/unit/test_answers checks that no other is left out)
AnyAnswer = (Stopping | Restarted | IngestOpened | Noted | Forwarded | Taking | Dumped | Cancelled | Paused | Resumed
             | Recovered | RecoverySaid | Notified)


def answer_from(op: str, result: Any) -> AnyAnswer | str | None:
    """An action's result as it was written before the answers were tagged (an older run's log): the answer of
    ``op`` (or the receipt it was), or its text when it is none of them, so that nothing of it is lost."""
    if not isinstance(result, dict):
        return result if result is None or isinstance(result, str) else json.dumps(result, default=str)[:2000]
    tag = result.get("answer")
    if tag is None:
        tag = "forwarded" if result.get("forwarded") else "taking" if "taking" in result else op
    try:
        return msgspec.convert({**result, "answer": tag}, AnyAnswer)
    except msgspec.ValidationError:  # a shape it does not know (a query's answer, a newer writer's): its text
        return json.dumps(result, default=str)[:2000]
