"""Telling a person who is not looking: each new critical alert, and its clearing, to a webhook and to a
command, off the supervisor's path.

A message is JSON that Slack-compatible receivers and generic ones both take: ``text``, a line a person
reads ("gkd run 20261129-0949: CRITICAL straggler on rollout/1: … (gkd-tui attach 20261129-0949)"), beside
the alert's own fields (``code``, ``severity``, ``targets``, ``message``, ``hint``), the run, the command
that attaches to it, and whether it is the alert or its clearing. A webhook gets it as a POST; a command
(``--notify-command``) on its stdin, run by the shell.

``Notifier.alert`` is called on the ingest's path, for every alert the run records: it decides and queues in
O(1) and never waits; a thread of its own sends, each send with a deadline and retried with backoff, and says
each outcome (``on_outcome``: delivered or not, after how many tries, why not) so that it goes on the record.
At most one message per alert (its code and targets) per quiet period: an alert whose message changes as its
wait grows is said once, and again only if it is still there a quiet period later; its clearing is said
once, if its alert was. A URL is said everywhere (the record, a log) as its scheme and host only: a
webhook's path and query hold its secret (Slack's ``/services/T…/B…/…``), and so can its user part.
"""

from __future__ import annotations

import base64
import functools
import json
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from gkd_core.telemetry.events import AlertEvent

QUIET_S = 600.0  # an alert said once per this long, however often its message changes
SEND_DEADLINE_S = 5.0  # one try of one message to one receiver
TRIES = 3
BACKOFF_S = 1.0  # before the second try; doubled before each next
QUEUE_MAX = 256  # messages not sent yet; past this, a message is dropped, and its drop said
COMMAND_DEADLINE_S = 10.0


@dataclass(frozen=True)
class Outcome:
    """What became of one message to one receiver (``to``: a URL as ``redacted`` says it, or "command")."""

    to: str
    kind: str  # "alert", "cleared", or what was done about one ("restart")
    code: str
    targets: tuple[str, ...]
    ok: bool
    tries: int
    error: str = ""


def redacted(url: str) -> str:
    """``https://hooks.slack.com/…``: the scheme, host and port alone (its path, query and user part can be the
    secret that lets anyone post)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    return f"{parts.scheme or '?'}://{host}{f':{parts.port}' if parts.port else ''}/…"


def message(alert: AlertEvent, run: str, attach: str) -> dict[str, Any]:
    """The JSON of one message about ``alert`` (its clearing when ``alert.cleared``)."""
    what = "cleared" if alert.cleared else alert.severity.upper()
    on = f" on {', '.join(alert.targets[:4])}" if alert.targets else ""
    text = f"gkd run {run}: {what} {alert.code}{on}: {alert.message}"[:1000] + f" ({attach})"
    return {"text": text, "run": run, "attach": attach, "kind": "cleared" if alert.cleared else "alert",
            "code": alert.code, "severity": alert.severity, "targets": list(alert.targets),
            "message": alert.message, "hint": alert.hint, "ts": alert.ts}


class Notifier:
    """Sends each new critical alert and its clearing to ``urls`` (webhooks) and ``commands`` (shell commands
    given the JSON on stdin), from a thread of its own; ``on_outcome`` hears how each went (on that thread)."""

    def __init__(self, urls: list[str], commands: list[str], run: str, attach: str,
                 on_outcome: Callable[[Outcome], None], quiet_s: float = QUIET_S,
                 backoff_s: float = BACKOFF_S, deadline_s: float = SEND_DEADLINE_S):
        self.urls, self.commands, self.run, self.attach = list(urls), list(commands), run, attach
        self.on_outcome, self.quiet_s, self.backoff_s, self.deadline_s = on_outcome, quiet_s, backoff_s, deadline_s
        self._said: dict[tuple[str, tuple[str, ...]], float] = {}  # an alert said -> when (monotonic)
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self.dropped = 0
        self._thread = threading.Thread(target=self._send_all, name="gkd-notify", daemon=True)
        self._thread.start()

    def alert(self, alert: AlertEvent) -> None:
        """An alert the run recorded (any: it is sorted here). Never waits."""
        key = (alert.code, tuple(sorted(alert.targets)))
        now = time.monotonic()
        if alert.cleared:
            if self._said.pop(key, None) is None:
                return  # its alert was never said (not critical, or before we were told)
        elif alert.severity != "critical":
            return
        elif key in self._said and now - self._said[key] < self.quiet_s:
            return
        else:
            self._said[key] = now
        try:
            self._queue.put_nowait(message(alert, self.run, self.attach))
        except queue.Full:  # receivers far slower than the alerts: this one is dropped, and that is said
            self.dropped += 1
            self.on_outcome(Outcome("(queue)", "cleared" if alert.cleared else "alert", alert.code, key[1], False, 0,
                                    f"{QUEUE_MAX} messages not sent yet: dropped"))

    def tell(self, kind: str, code: str, targets: list[str], said: str) -> None:
        """Something done about an alert (``kind`` "restart": the recovery restarted the run; "replace": it stopped
        workers for their driver to start again in their place), said at once,
        every time: each is news. Never waits."""
        text = f"gkd run {self.run}: {kind.upper()} after {code}: {said}"[:1000] + f" ({self.attach})"
        m = {"text": text, "run": self.run, "attach": self.attach, "kind": kind, "code": code, "severity": "info",
             "targets": list(targets), "message": said, "hint": "", "ts": time.time()}
        try:
            self._queue.put_nowait(m)
        except queue.Full:
            self.dropped += 1
            self.on_outcome(Outcome("(queue)", kind, code, tuple(targets), False, 0,
                                    f"{QUEUE_MAX} messages not sent yet: dropped"))

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is queued (within ``timeout_s``), then stop."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _send_all(self) -> None:
        while True:
            m = self._queue.get()
            if m is None:
                return
            for url in self.urls:
                self.on_outcome(self._tried(redacted(url), m, functools.partial(self._post, url, m)))
            for command in self.commands:
                self.on_outcome(self._tried("command", m, functools.partial(self._run, command, m)))

    def _tried(self, to: str, m: dict[str, Any], send: Callable[[], None]) -> Outcome:
        error = ""
        for tries in range(1, TRIES + 1):
            try:
                send()
                return Outcome(to, m["kind"], m["code"], tuple(m["targets"]), True, tries)
            except (OSError, ValueError, subprocess.SubprocessError) as e:  # said in the outcome, tried again
                error = f"{type(e).__name__}: {_without_secrets(str(e))}"[:300]
            if tries < TRIES:
                time.sleep(self.backoff_s * 2 ** (tries - 1))
        return Outcome(to, m["kind"], m["code"], tuple(m["targets"]), False, TRIES, error)

    def _post(self, url: str, m: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/json"}
        parts = urlsplit(url)
        if parts.username is not None:  # user:password@host: as basic auth (urllib would read it as the host)
            secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
            headers["Authorization"] = f"Basic {base64.b64encode(secret).decode()}"
            url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        request = urllib.request.Request(url, data=json.dumps(m).encode(), method="POST", headers=headers)
        with urllib.request.urlopen(request, timeout=self.deadline_s) as answer:
            if not 200 <= answer.status < 300:
                raise ValueError(f"the receiver answered {answer.status}")

    def _run(self, command: str, m: dict[str, Any]) -> None:
        done = subprocess.run(command, shell=True, input=json.dumps(m).encode(), capture_output=True,
                              timeout=COMMAND_DEADLINE_S)
        if done.returncode != 0:
            raise ValueError(f"exit {done.returncode}: {done.stderr.decode(errors='replace').strip()[-200:]}")


def _without_secrets(error: str) -> str:
    """An error's text with any URL in it said as ``redacted`` does (urllib's errors can quote the URL)."""
    return " ".join(redacted(w) if "://" in w else w for w in error.split())
