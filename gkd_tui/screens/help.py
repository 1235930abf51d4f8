"""`?`: every key, what it does, and what to do when a run is stuck."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """[b]gkd-tui keys[/b]

  d        dump the stacks of the selected worker (D: of every worker) → the stack viewer
  c        cancel: the selected worker's task, the current sync, or everything (asks first)
  r        restart smaller from the latest checkpoint (shows the config diff first)
  enter    the selected worker's details: state, last stack, its log lines
  /        filter the workers table (escape clears)
  b        write a bundle for a bug report: config, events, logs, stacks (never the keys)
  ?        this help           q  detach — the run goes on
  replay:  space play/pause, → step, End/Home jump, +/- speed

[b]When it is stuck[/b]
  1. The header names the worst alert and what to try. The sync gauge names who the sync
     waits for; a red STALE heartbeat means a frozen or dead process.
  2. d on that worker: the stack says which line it waits on.
  3. c to cancel the sync (the group is rebuilt and the sync retried), or r to restart
     smaller from the latest checkpoint (fewer workers, smaller batches)."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")
