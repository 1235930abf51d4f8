"""One error path for the dashboard's background actions (as harlequin has one): an action's thread
worker just raises, and the app's ``Worker.StateChanged`` handler turns the failure into one toast
naming the action and what went wrong; never a crash, never a traceback over the panes. What a view
cannot do at all (a replay has no run to act on) raises ``Refused``: a warning, since nothing failed."""

from __future__ import annotations

import functools
from collections.abc import Callable

from textual.app import App
from textual.worker import Worker, WorkerState

from gkd_core.errors import Refused as Refused  # (gkd's one refusal, gkd_core/errors.py)

ERROR_TOAST_S = 6.0  # long enough to read a control error's address or path
REFUSED_TOAST_S = 4.0


def action_worker(action: str | Callable[..., str], group: str = "control"):
    """Run the decorated app method in a thread worker named for the user's action: ``action`` is
    its name, or a function of the call's arguments giving it (``send("cancel", ...)`` is "cancel").
    A newer action of the same group replaces a pending one; a failure is left to ``toast_failure``."""

    def decorate(fn: Callable[..., None]) -> Callable[..., Worker]:
        @functools.wraps(fn)
        def start(app: App, *args, **kwargs) -> Worker:
            name = action(*args, **kwargs) if callable(action) else action
            return app.run_worker(functools.partial(fn, app, *args, **kwargs), name=name, group=group,
                                  thread=True, exclusive=True, exit_on_error=False)
        return start

    return decorate


def toast_failure(app: App, worker: Worker) -> None:
    """The toast for a background action that failed ("restart: no answer to 'restart' from ..."):
    a warning for ``Refused``, else an error. Nothing while it has not failed."""
    if worker.state != WorkerState.ERROR:
        return
    err = worker.error
    refused = isinstance(err, Refused)
    # not markup: an error's own text ("[Errno 17] File exists") is no style to apply
    app.notify(f"{worker.name}: {err or type(err).__name__}", severity="warning" if refused else "error",
               timeout=REFUSED_TOAST_S if refused else ERROR_TOAST_S, markup=False)
