"""A confirmation for a dangerous action. Focus starts on Cancel: a stray Enter does nothing."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from gkd_core.telemetry.answers import Restarted


class ConfirmScreen(ModalScreen[str | None]):
    """Returns the value of the chosen action, or None for Cancel / escape / n."""

    BINDINGS = [Binding("escape,n", "dismiss_none", "Cancel")]

    def __init__(self, title: str, body, choices: list[tuple[str, str]]):
        super().__init__()
        self.title_text = title
        self.body = body
        # (value, label): a value may be any text ("worker:rollout/0"), which a Textual id may not be,
        # so the buttons are "choice-<i>" and the values are looked up by it
        self.choices = choices

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog"):
            yield Static(self.title_text, id="dialog-title")
            yield Static(self.body, id="dialog-body", markup=False)  # a diff's values ("['a', 'b']") are no markup
            with Horizontal(id="dialog-buttons"):
                yield Button("Cancel", id="cancel", variant="primary")
                for i, (_, label) in enumerate(self.choices):
                    yield Button(label, id=f"choice-{i}", variant="error")

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        bid = event.button.id or ""
        self.dismiss(self.choices[int(bid.removeprefix("choice-"))][0] if bid.startswith("choice-") else None)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


def cancel_dialog(selected: str | None) -> ConfirmScreen:
    """`c`: the current sync, the selected worker's task (not the driver's: it is the run), or everything."""
    choices = [("sync", "The current sync")]
    if selected and selected != "driver":
        choices.append((f"worker:{selected}", f"{selected}'s task"))
    choices.append(("all", "Everything"))
    body = ("Cancel stops Python-level work at its next check; the sync's group is rebuilt and the "
            "sync retried. Nothing is cancelled unless you choose it.")
    return ConfirmScreen("Cancel what?", body, choices)


def restart_dialog(dry: Restarted) -> ConfirmScreen:
    """`r`: the config diff of the supervisor's dry run (``restart {dry_run: true}``), each change with
    the finding it follows from, before anything restarts."""
    diff = "\n".join(f"  {key}: {old!r} -> {new!r}" + (f"\n      ← {why}" if why else "")
                     for key, old, new, why in dry.changes) or "  (nothing to shrink)"
    body = (f"Restart {dry.restart} from the latest checkpoint with a smaller config:\n{diff}\n\n"
            "The new config is written to RUN/restarts/ before the driver starts again.")
    return ConfirmScreen("Restart smaller?", body, [("restart", "Restart smaller")])
