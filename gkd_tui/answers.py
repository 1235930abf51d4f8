"""The outcome of a request made from the dashboard, shown where its key was pressed.

A request that the driver carries out (``cancel``, ``dump_stacks``) is answered twice: the supervisor's
receipt at once ("handed to the driver"), then the driver's outcome, an ``action`` event with the
request's id ("sync 4 cancelled with rollout/1 pending after 3.1 s; ..."), which the live source hands
over as it arrives (``ActionAnswered``): nothing is polled for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from textual.message import Message

from gkd_core.telemetry import events as ev
from gkd_core.telemetry.answers import Answer, Forwarded, Receipt
from gkd_core.telemetry.control import new_request_id


class ActionAnswered(Message):
    """An ``action`` event that answers a request (posted from the live source's thread)."""

    def __init__(self, event: ev.ActionEvent):
        super().__init__()
        self.event = event


class PendingAnswers:
    """The requests this dashboard made whose outcome it still waits for, by id."""

    def __init__(self, say: Callable[..., Any] | None = None):
        self._say = say  # the app's notify: what is shown, on the app's thread
        self._asked: dict[int, str] = {}
        # a receipt said but not shown yet (the worker thread shows it through the app's thread), and an outcome
        # that came meanwhile, held so that it shows after the receipt, never before it
        self._receipting: set[int] = set()
        self._held: dict[int, tuple[str, bool]] = {}
        self._lock = threading.Lock()  # a worker thread asks; the app's thread hears the answers

    def ask(self, op: str) -> int:
        """An id for a request of ``op``, noted before it is sent (its outcome may come before its receipt)."""
        request = new_request_id()
        with self._lock:
            self._asked[request] = op
        return request

    def receipt(self, request: int, op: str, answer: Answer) -> str | None:
        """What to say of the supervisor's reply: for a request handed to the driver, that its outcome follows
        (None when the outcome came first); else the reply is the outcome."""
        with self._lock:
            waiting = request in self._asked
            if not waiting:
                return None  # its action event came first, and was shown
            if not isinstance(answer, Receipt):
                del self._asked[request]
                return f"{op}: {answer.said()}"
            self._receipting.add(request)
        to = answer.to if isinstance(answer, Forwarded) else "supervisor"
        return f"{op}: handed to the {to}; its outcome will show here"

    def shown(self, request: int) -> tuple[str, bool] | None:
        """The receipt of ``request`` is on screen: the outcome that came meanwhile (its text, whether it went
        well), to show now, or None."""
        with self._lock:
            self._receipting.discard(request)
            return self._held.pop(request, None)

    def show_receipt(self, request: int, said: str) -> None:
        """(The app's thread) the receipt on screen, then the outcome that came while it was on its way."""
        assert self._say is not None, "PendingAnswers made without a way to show what it says"
        self._say(said, timeout=4, markup=False)
        if (then := self.shown(request)) is not None:
            self._show_outcome(*then)

    def hear(self, e: ev.ActionEvent) -> None:
        """(The app's thread) an action event: shown when it is the outcome of a request of ours, due now."""
        said = self.answered(e)
        if said is not None:
            self._show_outcome(said, e.ok)

    def _show_outcome(self, said: str, ok: bool) -> None:
        assert self._say is not None, "PendingAnswers made without a way to show what it says"
        self._say(said, timeout=10, markup=False, severity="information" if ok else "error")

    def answered(self, e: ev.ActionEvent) -> str | None:
        """The outcome to show, when ``e`` is a driver's answer to a request of ours."""
        if not e.request or e.is_receipt:
            return None
        with self._lock:
            op = self._asked.pop(e.request, None)
            if op is not None and e.request in self._receipting:  # after its receipt, which is on its way
                self._held[e.request] = (e.said(), e.ok)
                return None
        return e.said() if op is not None else None
