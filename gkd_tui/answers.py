"""The outcome of a request made from the dashboard, shown where its key was pressed.

A request that the driver carries out (``cancel``, ``dump_stacks``) is answered twice: the supervisor's
receipt at once ("handed to the driver"), then the driver's outcome, an ``action`` event with the
request's id ("sync 4 cancelled with rollout/1 pending after 3.1 s; ..."), which the live source hands
over as it arrives (``ActionAnswered``): nothing is polled for it.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from textual.message import Message

from gkd_core.telemetry import events as ev
from gkd_core.telemetry.control import new_request_id


class ActionAnswered(Message):
    """An ``action`` event that answers a request (posted from the live source's thread)."""

    def __init__(self, event: ev.ActionEvent):
        super().__init__()
        self.event = event


def outcome_text(op: str, ok: bool, result: Any) -> str:
    """``cancel: sync 4 cancelled …`` or ``cancel failed: no weight sync is under way …``."""
    if isinstance(result, dict) and "outcome" in result:
        said = result["outcome"]
        if isinstance(said, dict):  # a watched job's driver: one outcome per worker
            said = "; ".join(f"{who}: {what}" for who, what in said.items())
    elif isinstance(result, str):
        said = result
    else:
        said = json.dumps(result)
    return f"{op}{'' if ok else ' failed'}: {said}"


class PendingAnswers:
    """The requests this dashboard made whose outcome it still waits for, by id."""

    def __init__(self):
        self._asked: dict[int, str] = {}
        self._lock = threading.Lock()  # a worker thread asks; the app's thread hears the answers

    def ask(self, op: str) -> int:
        """An id for a request of ``op``, noted before it is sent (its outcome may come before its receipt)."""
        request = new_request_id()
        with self._lock:
            self._asked[request] = op
        return request

    def receipt(self, request: int, op: str, result: Any) -> str | None:
        """What to say of the supervisor's reply: for a request handed to the driver, that its outcome follows
        (None when the outcome came first); else the reply is the outcome."""
        with self._lock:
            waiting = request in self._asked
            if not waiting:
                return None  # its action event came first, and was shown
            if not (isinstance(result, dict) and result.get("forwarded")):
                del self._asked[request]
                return outcome_text(op, True, result)
        return f"{op}: handed to the {result.get('to', 'driver')}; its outcome will show here"

    def answered(self, e: ev.ActionEvent) -> str | None:
        """The outcome to show, when ``e`` is a driver's answer to a request of ours."""
        if not e.request or e.forwarded:
            return None
        with self._lock:
            op = self._asked.pop(e.request, None)
        return outcome_text(op, e.ok, e.result) if op is not None else None
