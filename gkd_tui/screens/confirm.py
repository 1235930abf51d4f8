"""A confirmation for a dangerous action. Focus starts on Cancel: a stray Enter does nothing."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static


class ConfirmScreen(ModalScreen[str | None]):
    """Returns the id of the chosen action button, or None for Cancel / escape / n."""

    BINDINGS = [Binding("escape,n", "dismiss_none", "Cancel")]

    def __init__(self, title: str, body, choices: list[tuple[str, str]]):
        super().__init__()
        self.title_text = title
        self.body = body
        self.choices = choices  # (button id, label)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title")
            yield Static(self.body, id="dialog-body")
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                for bid, label in self.choices:
                    yield Button(label, id=bid, variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(None if event.button.id == "cancel" else event.button.id)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
