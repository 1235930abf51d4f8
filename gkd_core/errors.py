"""The one base of the errors a person reads, and the refusal: every error class of gkd's is a ``GkdError``.

Its message says what went wrong and where, in words a user of the tool reads (a refusal in the dashboard, a
line of the CLI, the reason a run ended); ``what_to_do``, where the raiser knows it, says what to try next.
Each kind subclasses it beside the builtin its callers catch (``ConfigError(GkdError, ValueError)``), so an
``except ValueError`` takes it still.
"""

from __future__ import annotations


class GkdError(Exception):
    what_to_do: str = ""  # what to try next, when the raiser knows ("" when the message says it)


class Refused(GkdError):
    """A request understood and not carried out (no driver to take it, a run that is stopping, a replay with
    nobody to ask); the message says why."""
