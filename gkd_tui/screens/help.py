"""`?`: every key, what it does, and what to do when a run is stuck."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """[b]gkd-tui keys[/b]
  d      the selected worker's stacks → the stack viewer (D: everyone's)
  c      cancel the selected worker's task, the current sync or everything
  r      restart smaller from the latest checkpoint (the diff first)
  P      pause the driver at its step's end (the run kept, for an hour at
         most), or resume a paused one
  enter  the selected worker's details: state, last stack, log lines;
         on a group's line, open or close the group
  /      filter the workers by name, phase, node or pid (escape clears)
  b      a bug report: summary.md, every worker's stacks, versions, command,
         variables, Ray's view, logs (never keys or tokens)
  p      plots: loss/KL/agreement, sync times, step time by phase, teacher
         latency and queue, GPU use, memory, a pipeline's queue depth
         (1-7 switch, escape closes)
  ?      this help    q  detach: the run goes on    ctrl+p  every action
  replay: space play/pause, → step, End/Home jump, +/- speed
  c and r ask first, with the focus on Cancel.

[b]When it is stuck[/b]
  1. The header names the worst alert and what to try. The sync gauge
     names who the sync waits for; a red STALE heartbeat means a frozen
     or dead process.
  2. d on that worker: the stack says which line it waits on.
  3. c to cancel the sync (its group is rebuilt, the sync retried), or
     r to restart smaller from the latest checkpoint (fewer workers,
     smaller batches)."""


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,q,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):  # a terminal shorter than the help scrolls it
            yield Static(HELP)
