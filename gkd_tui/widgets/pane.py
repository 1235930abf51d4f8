"""A text pane that repaints only when its text changed, and lays out only when its shape did.

The app redraws ten times a second so a phase change reaches the screen quickly. Most of those
redraws change nothing in most panes; and a changed number rarely changes a pane's size, while a
layout of the whole screen costs tens of milliseconds with a large table beside it.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.widgets import Static

from gkd_tui.widgets.styles import PANE_CLASSES


class Pane(Static):
    COMPONENT_CLASSES = PANE_CLASSES  # what colours say, styled in app.tcss (widgets/styles.py)
    _shown: tuple | None = None
    _shape: tuple | None = None

    def tone(self, name: str | None) -> Style | str:
        """The style app.tcss gives ``name`` (a name of widgets/styles.py); none for None."""
        return self.get_component_rich_style(name, partial=True) if name else ""

    def put(self, t: Text) -> None:
        key = (t.plain, tuple(t.spans))
        if key == self._shown:
            return
        self._shown = key
        # a line that grows past the pane's width wraps, so the lengths are the shape
        shape = tuple(len(line) for line in t.plain.split("\n"))
        self.update(t, layout=shape != self._shape)
        self._shape = shape
